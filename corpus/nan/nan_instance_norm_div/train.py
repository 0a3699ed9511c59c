"""Classify machine states from windows of vibration sensor readings (instance-normalized).

Bug: each window is standardized by its own mean and std. A dead sensor channel reads exactly
0.0 for the whole window that lands in row 7 of the batch of step 7: its std is 0, and
(x - mean) / std is 0 / 0 = NaN. The loss turns NaN, the weights follow, and training goes on.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

WINDOW, CLASSES = 64, 4


class WindowNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 8, kernel_size=5, padding=2)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=1, keepdim=True)
        std = x.std(dim=1, keepdim=True)
        x = (x - mean) / std  # reprocut: nan origin
        h = F.relu(self.conv(x.unsqueeze(1))).mean(-1)
        return self.head(h)


def windows(steps: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    labels = torch.randint(0, CLASSES, (steps * batch,), generator=g)
    t = torch.linspace(0, 6.28, WINDOW)
    x = torch.sin(t * (labels[:, None] + 1)) + 0.3 * torch.randn(steps * batch, WINDOW, generator=g)
    x[7 * batch + 7] = 0.0  # the sensor died for this window
    return x, labels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = windows(args.steps, args.batch_size)
    model = WindowNet().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
        logits = model(x[rows].to(args.device))
        loss = F.cross_entropy(logits, y[rows].to(args.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
