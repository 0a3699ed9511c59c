"""Train a tiny point-cloud segmentation network (EdgeConv-like) on synthetic scans.

Bug: the k-NN search marks missing neighbours with -1 when a point has fewer than k points
within the radius. The custom gather's forward accepts -1 (wraps to the last point); its
backward does not. The first sparse scan (an outlier point) is at step 5, and the error is
raised in backward.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from ops import gather_neighbours

K, RADIUS = 4, 0.8


def radius_knn(points: torch.Tensor) -> torch.Tensor:
    dist = torch.cdist(points, points)
    dist.fill_diagonal_(float("inf"))
    d, idx = dist.topk(K, largest=False)
    return idx.masked_fill(d > RADIUS, -1)


class EdgeConv(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * cin, cout), nn.ReLU())

    def forward(self, feats: torch.Tensor, knn: torch.Tensor) -> torch.Tensor:
        nbrs = gather_neighbours(feats, knn)
        center = feats[:, None].expand_as(nbrs)
        return self.mlp(torch.cat([center, nbrs - center], -1)).max(1).values


class PointSeg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = EdgeConv(3, 32)
        self.conv2 = EdgeConv(32, 32)
        self.head = nn.Linear(32, 3)

    def forward(self, points: torch.Tensor, knn: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv2(self.conv1(points, knn), knn))


def make_scan(step: int, n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    points = torch.rand(n, 3, generator=g)
    if step == 5:
        points[17] = torch.tensor([4.0, 4.0, 4.0])  # a stray reflection far from the scene
    labels = (points[:, 2] > 0.5).long() + (points[:, 0] > 0.5).long()
    return points, labels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = PointSeg().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(args.steps):
        points, labels = make_scan(step)
        points, labels = points.to(args.device), labels.to(args.device)
        knn = radius_knn(points)
        loss = F.cross_entropy(model(points, knn), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
