"""Learn face embeddings with a triplet loss on Euclidean distances.

Bug: the distance is sqrt(sum((a - p)²)). At step 5 the sampler pairs an image with itself as
its own positive (a duplicate in the dataset): the distance is exactly 0, which is fine in
forward, but d sqrt(u)/du = 1 / (2 sqrt(u)) is inf at 0, so backward makes inf, then NaN
gradients. The loss of step 5 is finite; the weights are NaN after it, and nothing raises.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM = 24


class Embedder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 48), nn.ReLU(), nn.Linear(48, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a - b) ** 2).sum(dim=1).sqrt()  # reprocut: nan origin


def triplets(step: int, batch: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    anchor = torch.randn(batch, DIM, generator=g)
    positive = anchor + 0.1 * torch.randn(batch, DIM, generator=g)
    negative = torch.randn(batch, DIM, generator=g)
    if step == 5:
        positive[2] = anchor[2]  # the same photo, uploaded twice
    return anchor, positive, negative


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    model = Embedder().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        a, p, n = (t.to(args.device) for t in triplets(step, args.batch_size, g))
        ea, ep, en = model(a), model(p), model(n)
        loss = F.relu(distance(ea, ep) - distance(ea, en) + 1.0).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} triplet {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
