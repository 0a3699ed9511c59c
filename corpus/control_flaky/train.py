"""Negative control: a flaky run. The bug fires only on some runs.

Bug: random-erasing augmentation is unseeded (it draws from os.urandom) and, in rare cases,
writes the "erased" class id 10 into a 10-class target for mixup-style label erasing. About half
of the runs hit it at some step; the others finish. Nothing here is seeded on purpose.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES = 10


def augment(labels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
    if torch.rand(1, generator=rng).item() < 0.06:  # rare "erase" branch
        labels = labels.clone()
        labels[0] = CLASSES
    return labels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, CLASSES)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.randn(16, 20, generator=rng).to(args.device)
        y = augment(torch.randint(0, CLASSES, (16,), generator=rng), rng).to(args.device)
        loss = F.cross_entropy(model(x), y)  # reprocut: culprit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
