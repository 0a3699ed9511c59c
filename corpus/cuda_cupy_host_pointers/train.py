"""Train a two-tower recommender whose item lookup is a CuPy kernel (CUDA only).

Item ids are mapped from the catalog's global ids to local rows of the item table by
`local_rows`. Bug: from step 5 on, a "new arrivals" shelf is appended to each batch with its
global ids (around 2**33), never mapped: the kernel reads rows terabytes past the item table,
an illegal memory access at its launch.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import gather_rows

ITEMS, DIM, USERS, BATCH, SHELF = 50_000, 64, 1_000, 512, 8
GLOBAL_BASE = 1 << 33  # the catalog's global ids start here


def local_rows(global_ids: torch.Tensor) -> torch.Tensor:
    return global_ids - GLOBAL_BASE


def batch(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    users = torch.randint(0, USERS, (BATCH,), generator=g)
    items = local_rows(GLOBAL_BASE + torch.randint(0, ITEMS, (BATCH,), generator=g))
    if step >= 5:  # the new-arrivals shelf, added after the mapping
        arrivals = GLOBAL_BASE + ITEMS + torch.randint(0, 1000, (SHELF,), generator=g)
        items = torch.cat([items[: BATCH - SHELF], arrivals])
    clicks = torch.randint(0, 2, (BATCH,), generator=g).float()
    return users.to(device), items.to(device), clicks.to(device)


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(USERS, DIM)
        self.item_proj = nn.Linear(DIM, DIM)

    def forward(self, users: torch.Tensor, item_vectors: torch.Tensor) -> torch.Tensor:
        return (self.users(users) * self.item_proj(item_vectors)).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    item_table = torch.randn(ITEMS, DIM, device=args.device) * 0.1  # frozen, pre-trained
    model = TwoTower().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        users, items, clicks = batch(step, args.device)
        with torch.no_grad():
            item_vectors = gather_rows(item_table, items)
        loss = F.binary_cross_entropy_with_logits(model(users, item_vectors), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
