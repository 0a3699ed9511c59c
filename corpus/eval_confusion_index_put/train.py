"""Train an activity-recognition MLP on sensor windows and evaluate with a confusion matrix.

Bug: the validation split contains the "transition" activity (label 6), which the training
split (and the 6-class model) never had. Training is fine; the confusion matrix update in the
first evaluation (after step 10, under torch.no_grad()) indexes row 6 of a 6x6 matrix.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES, WINDOW = 6, 24


def split(n: int, seed: int, with_transition: bool) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, WINDOW, generator=g)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    if with_transition:
        y[37] = NUM_CLASSES
    return TensorDataset(x, y)


class HARNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 32, 5, padding=2)
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(32 * WINDOW, 64), nn.ReLU(),
                                nn.Linear(64, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.conv(x)))


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: str) -> float:
    model.eval()
    confusion = torch.zeros(NUM_CLASSES, NUM_CLASSES, device=device)
    ones = None
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        pred = model(x).argmax(1)
        ones = torch.ones(len(y), device=device)
        confusion.index_put_((y, pred), ones, accumulate=True)  # reprocut: culprit
    model.train()
    return float(confusion.diag().sum() / confusion.sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    train = DataLoader(split(320, 1, False), batch_size=args.batch_size, shuffle=False)
    val = DataLoader(split(96, 2, True), batch_size=args.batch_size)
    model = HARNet().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    for epoch in range(args.epochs):
        for x, y in train:
            x, y = x.to(args.device), y.to(args.device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        print(f"epoch {epoch} step {step} train loss {loss.item():.4f}", flush=True)
        print(f"epoch {epoch} val acc {evaluate(model, val, args.device):.3f}", flush=True)


if __name__ == "__main__":
    main()
