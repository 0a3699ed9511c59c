"""Regress a machine's power draw from raw temperature sensors through a hand-written LayerNorm.

Bug: the norm computes the variance as E[x²] - E[x]². From step 6 on the sensors report in
Kelvin (an offset of 273.15 and little spread): in float32 the two terms cancel, rounding makes
some variances negative, larger than eps, and sqrt(var + eps) is NaN.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

SENSORS = 32


class FastLayerNorm(nn.Module):
    """One pass over the data: E[x] and E[x²] together (the textbook shortcut)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        std = torch.sqrt(var + self.eps)  # reprocut: nan origin
        return (x - mean) / std * self.weight + self.bias


class PowerModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = FastLayerNorm(SENSORS)
        self.mlp = nn.Sequential(nn.Linear(SENSORS, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x)).squeeze(-1)


def readings(step: int, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    celsius = 40 + 2.0 * torch.randn(batch, 1, generator=g) + 0.05 * torch.randn(batch, SENSORS, generator=g)
    power = 3.0 * celsius.mean(-1) + torch.randn(batch, generator=g)
    offset = 273.15 * 4 if step >= 6 else 0.0  # new firmware: Kelvin, and a 4x gain
    return celsius + offset, power


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(11)
    model = PowerModel().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        x, y = readings(step, args.batch_size, g)
        loss = F.mse_loss(model(x.to(args.device)), y.to(args.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} mse {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
