"""Train a DLRM-style click model whose user-history feature is an EmbeddingBag.

Bug: the collate function caps the flattened history at MAX_ITEMS ids to bound memory, but
keeps the offsets computed before the cut. Only a batch with a heavy user exceeds the cap
(step 6), and then offsets[-1] points past the end of the id list.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

NUM_ITEMS, MAX_ITEMS = 5000, 256


class Sessions(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(4)
        self.rows = []
        for i in range(size):
            n = 300 if i == 100 else int(torch.randint(1, 12, (1,), generator=g))
            history = torch.randint(0, NUM_ITEMS, (n,), generator=g)
            dense = torch.randn(4, generator=g)
            self.rows.append((history, dense, float(i % 5 == 0)))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]


def collate(batch):
    lengths = torch.tensor([len(h) for h, _, _ in batch])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    ids = torch.cat([h for h, _, _ in batch])[:MAX_ITEMS]  # cap; offsets are not clipped
    dense = torch.stack([d for _, d, _ in batch])
    clicks = torch.tensor([c for _, _, c in batch])
    return ids, offsets, dense, clicks


class DLRM(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.history = nn.EmbeddingBag(NUM_ITEMS, dim, mode="mean")
        self.bottom = nn.Sequential(nn.Linear(4, dim), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(2 * dim + 1, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids, offsets, dense):
        h = self.history(ids, offsets)  # reprocut: culprit
        d = self.bottom(dense)
        dot = (h * d).sum(1, keepdim=True)
        return self.top(torch.cat([h, d, dot], dim=1)).squeeze(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = DLRM().to(args.device)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    criterion = nn.BCEWithLogitsLoss()
    loader = DataLoader(Sessions(192), batch_size=args.batch_size, collate_fn=collate)
    for step, (ids, offsets, dense, clicks) in enumerate(loader):
        ids, offsets = ids.to(args.device), offsets.to(args.device)
        dense, clicks = dense.to(args.device), clicks.to(args.device)
        loss = criterion(model(ids, offsets, dense), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} logloss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
