"""Train a two-tower retrieval model with hashed item ids and a row-wise optimizer.

Bug: the item tower hashes ids into `num_buckets` rows (`ids % num_buckets`), but the loop tells
the optimizer which rows were touched using the raw ids. Raw ids are below the bucket count for
the catalogue the model started with; the first new item (id >= 2000) arrives at step 6, and the
optimizer step indexes a row that does not exist.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from optim import RowWiseAdagrad

NUM_BUCKETS, NUM_USERS = 2000, 300


class TwoTower(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.user = nn.Embedding(NUM_USERS, dim)
        self.item = nn.Embedding(NUM_BUCKETS, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        u = self.proj(self.user(users))
        v = self.item(items % NUM_BUCKETS)
        return u @ v.T  # in-batch softmax logits


def interactions(step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    users = torch.randint(0, NUM_USERS, (batch,), generator=g)
    items = torch.randint(0, NUM_BUCKETS, (batch,), generator=g)
    if step >= 6:
        items[3] = NUM_BUCKETS + 17  # a new item added to the catalogue
    return users, items


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TwoTower().to(args.device)
    others = [p for name, p in model.named_parameters() if name != "item.weight"]
    optimizer = RowWiseAdagrad(
        [{"params": [model.item.weight], "rowwise": True}, {"params": others}], lr=0.05
    )
    for step in range(args.steps):
        users, items = (t.to(args.device) for t in interactions(step, args.batch_size))
        logits = model(users, items)
        loss = F.cross_entropy(logits, torch.arange(len(users), device=args.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.set_touched_rows(items)  # raw ids, not the hashed rows
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
