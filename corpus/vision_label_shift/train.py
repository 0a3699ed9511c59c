"""Train a ResNet-ish classifier on a folder dataset whose class index was built from the
training folders only.

Bug: `class_to_idx` comes from the folders present at startup (9 classes, model has 9 outputs);
the "extra" folder of a later shard maps to index 9. Batches are ordered by shard, so the first
sample of class 9 arrives at step 10.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

FOLDERS = ["airplane", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class TinyResNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layer1(self.stem(x))).flatten(1))


class ShardedFolders(Dataset):
    """Synthetic images; shard 2 contains a folder that was not there when indexing."""

    def __init__(self, class_to_idx: dict[str, int]) -> None:
        g = torch.Generator().manual_seed(11)
        self.samples = []
        for shard in range(3):
            folders = FOLDERS + (["other"] if shard == 2 else [])
            for i in range(64):
                name = folders[(i * 7 + shard) % len(folders)]
                label = class_to_idx.setdefault(name, len(class_to_idx))
                self.samples.append((torch.randn(3, 16, 16, generator=g), label))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    class_to_idx = {name: i for i, name in enumerate(FOLDERS)}
    model = TinyResNet(num_classes=len(class_to_idx)).to(args.device)
    dataset = ShardedFolders(class_to_idx)
    loader = DataLoader(dataset, batch_size=args.batch_size)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    step = 0
    for epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.to(args.device), labels.to(args.device)
            loss = criterion(model(images), labels)  # reprocut: culprit
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 3 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
