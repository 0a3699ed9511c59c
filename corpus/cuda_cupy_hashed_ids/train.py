"""Train a click-through model on hashed categorical features pooled by a CuPy kernel (CUDA only).

Features are raw 64-bit hashes; `featurize` reduces them modulo the hashed table's rows. Bug:
the "campaign" feature, added to the batches from step 6 on, is appended after that reduction,
so its raw hashes (up to 2**40) reach the kernel as row ids and it reads terabytes past the
table: an illegal memory access at the launch.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import hashed_bag

ROWS, DIM, BATCH, FIELDS = 1 << 16, 32, 256, 6


def featurize(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    raw = torch.randint(0, 1 << 40, (BATCH, FIELDS), generator=g)
    ids = raw % ROWS
    if step >= 6:  # new field, added after the modulo
        campaign = torch.randint(0, 1 << 40, (BATCH, 1), generator=g)
        ids = torch.cat([ids, campaign], dim=1)
    clicks = torch.randint(0, 2, (BATCH,), generator=g).float()
    return ids.to(device), clicks.to(device)


class ClickModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.mlp(pooled).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=9)
    args = parser.parse_args()

    torch.manual_seed(0)
    table = torch.randn(ROWS, DIM, device=args.device) * 0.05  # frozen, pre-trained
    model = ClickModel().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        ids, clicks = featurize(step, args.device)
        with torch.no_grad():
            pooled = hashed_bag(ids, table)
        loss = F.binary_cross_entropy_with_logits(model(pooled), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
