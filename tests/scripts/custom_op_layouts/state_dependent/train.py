"""Averages bag features with `norm::scaled` (ops.py), whose scale is module state set from the
command line. Bug: from step 3 an empty bag (0 items) reaches the op, which raises. A captured
call of the op alone has no scale set: it raises a TypeError instead, so reprocut reduces the
script and says why."""

import argparse

import ops
import torch


def bags(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    counts = torch.randint(1, 5, (6,), generator=g)
    if step >= 3:  # a user with no items this week
        counts[2] = 0
    return torch.randn(6, 4, generator=g), counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=2.0)
    args = parser.parse_args()
    ops.SCALE = args.scale
    weights = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weights], lr=0.1)
    for step in range(5):
        x, counts = bags(step)
        loss = (ops.scaled(x, counts) * weights).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
