"""Train a small U-Net on VOC-style masks.

Bug: VOC masks mark object borders with 255 ("void"), but the loss uses the default
ignore_index (-100). The first masks are clean crops; the first crop with a border is at step 5.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 5


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.down1 = conv_block(3, 8)
        self.down2 = conv_block(8, 16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = conv_block(16, 8)
        self.out = nn.Conv2d(8, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        return self.out(self.dec(torch.cat([self.up(d2), d1], dim=1)))


class VOCCrops(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(5)
        self.items = []
        for i in range(size):
            image = torch.randn(3, 32, 32, generator=g)
            mask = torch.randint(0, NUM_CLASSES, (32, 32), generator=g)
            if i >= 20 and i % 10 == 0:  # crops that include an object border
                mask[10, 4:28] = 255
            self.items.append((image, mask))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = UNet(NUM_CLASSES).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(VOCCrops(48), batch_size=args.batch_size)
    step = 0
    for epoch in range(args.epochs):
        for images, masks in loader:
            images, masks = images.to(args.device), masks.to(args.device)
            logits = model(images)
            loss = F.cross_entropy(logits, masks)  # reprocut: culprit
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
