"""Train a digit-classifier MLP on 28x28 images, then evaluate it on a held-out split.

Bug: the training step flattens each batch before the model (`images.flatten(1)`); the
evaluation written later feeds the loader's (N, 1, 28, 28) batches as they come. Training is
fine; the first evaluation (after step 10, under torch.no_grad()) hands fc1 a 4-D batch, which
F.linear multiplies as (N * 28, 28) @ (784, 256).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def digits(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(self.fc1(flat))  # reprocut: culprit
        return self.fc2(hidden)


def train_step(
    model: MLP, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor
) -> float:
    loss = F.cross_entropy(model(images.flatten(1)), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: MLP, loader: DataLoader, device: str) -> float:
    model.eval()
    correct = total = 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        correct += int((model(images).argmax(1) == labels).sum())
        total += len(labels)
    model.train()
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    train = DataLoader(digits(640, 1), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(digits(128, 2), batch_size=args.batch_size)
    model = MLP().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        for images, labels in train:
            loss = train_step(model, optimizer, images.to(args.device), labels.to(args.device))
        print(f"epoch {epoch} train loss {loss:.4f}", flush=True)
        print(f"epoch {epoch} val acc {evaluate(model, val, args.device):.3f}", flush=True)


if __name__ == "__main__":
    main()
