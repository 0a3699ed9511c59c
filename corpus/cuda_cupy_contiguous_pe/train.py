"""Train a sequence autoencoder with a CuPy positional-encoding kernel (CUDA only).

Bug: training builds the positional encodings with `.repeat(B, 1, 1)` (a contiguous copy); the
evaluation path, written later "to save memory", uses `.expand(B, -1, -1)` (stride 0 over the
batch, 4 MB of storage for a 1 GB logical tensor). The kernel assumes contiguous inputs and
reads 1 GB from the 4 MB table at the first evaluation (after step 6, under torch.no_grad()).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import add_positional

B, T, D = 256, 256, 4096


def sinusoidal(t: int, d: int) -> torch.Tensor:
    pos = torch.arange(t)[:, None]
    div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = torch.zeros(t, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    return pe


class SeqAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pe", sinusoidal(T, D))
        self.inp = nn.Linear(16, D)
        self.out = nn.Linear(D, 16)

    def forward(self, x: torch.Tensor, memory_saving: bool = False) -> torch.Tensor:
        h = self.inp(x)
        if memory_saving:
            pe = self.pe[None].expand(x.shape[0], -1, -1)
        else:
            pe = self.pe[None].repeat(x.shape[0], 1, 1)
        return self.out(F.gelu(add_positional(h, pe, math.sqrt(D))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SeqAutoencoder().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        x = torch.randn(B, T, 16, device=args.device)
        loss = F.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                val = torch.randn(B, T, 16, device=args.device)
                val_loss = F.mse_loss(model(val, memory_saving=True), val)
            print(f"step {step} val loss {val_loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
