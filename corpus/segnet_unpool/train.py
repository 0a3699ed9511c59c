"""Train a SegNet-style encoder/decoder with multi-scale augmentation.

Bug: scale jitter (enabled after 6 warm-up steps) picks odd crop sizes. For a 33-pixel crop the
pool returns 16x16 maps whose indices address a 33-wide image, while MaxUnpool2d (no
output_size passed) rebuilds a 32x32 map: indices in the last row point past its end. The
first odd crop is at step 7.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

BASE_CROP, NUM_CLASSES = 32, 4


class SegNet(nn.Module):
    def __init__(self, crop: int) -> None:
        super().__init__()
        self.crop = crop
        self.enc = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)
        self.dec = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, NUM_CLASSES, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, indices = self.pool(self.enc(x))
        h = self.unpool(h, indices)  # reprocut: culprit
        return self.dec(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SegNet(BASE_CROP).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        crop = BASE_CROP if step < args.warmup else (BASE_CROP, BASE_CROP + 1)[step % 2]
        images = torch.randn(args.batch_size, 3, crop, crop, device=args.device)
        masks = torch.randint(0, NUM_CLASSES, (args.batch_size, crop, crop), device=args.device)
        logits = model(images)
        loss = F.cross_entropy(logits, masks[:, :BASE_CROP, :BASE_CROP])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} crop {crop} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
