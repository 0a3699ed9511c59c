"""Fits a per-cell feature table to point targets. The op that reads the table is in
kernels.py (numpy kernel, torch fallback). Bug: from step 4 the augmentation clamps points to
[0, 1] inclusive, and a point on the far edge gets cell GRID * GRID: one past the table."""

import argparse

import torch
import torch.nn.functional as F
from kernels import GRID, cell_features, cells_of


def points(step: int, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    xy = torch.rand(n, 2, generator=g) * 0.999
    if step >= 4:  # jitter, then clamped back into the unit square
        xy = (xy + 0.2 * torch.randn(n, 2, generator=g)).clamp(0.0, 1.0)
    return xy, torch.sin(6.0 * xy).sum(dim=1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    table = torch.zeros(GRID * GRID, 1, requires_grad=True)
    optimizer = torch.optim.SGD([table], lr=args.lr)
    for step in range(args.steps):
        xy, target = points(step)
        loss = F.mse_loss(cell_features(table, cells_of(xy)), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
