"""Train a small image classifier whose labels were read as 1..10 instead of 0..9.

The bug: the dataset's label file counts classes from 1, the model has 10 outputs. Label 10 is
rare (one image in 240), so training runs for a few steps and then dies.

On CPU:   IndexError: Target 10 is out of bounds.
On CUDA:  Assertion `t >= 0 && t < n_classes` failed, reported at loss.backward() or later.

    python examples/train_classifier.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


def make_dataset(size: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(size, 3, 16, 16, generator=generator)
    labels = torch.randint(1, 10, (size,), generator=generator)  # "1-based" labels 1..9
    labels[117] = 10  # the rare last class: sample 117 is in batch 7
    return TensorDataset(images, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SmallCNN(num_classes=10).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(make_dataset(240), batch_size=args.batch_size, shuffle=False)

    step = 0
    for epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.to(args.device), labels.to(args.device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)  # reprocut: culprit
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
