"""Train a 2-layer GCN on a stream of molecule-like graphs (graph classification).

Bug: a pre-transform adds a virtual "super node" edge to every graph with more than 14 atoms
but does not append a feature row for it, so edge_index points one past the last node. Graphs
are sorted by size, so the first large graph arrives at step 11 (as the last graph of its batch, so its edges point past the batch).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def add_super_node(x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """Connect every node to a virtual node `n` (the feature row is "added later")."""
    n = x.shape[0]
    nodes = torch.arange(n)
    extra = torch.stack([nodes, torch.full_like(nodes, n)])
    return torch.cat([edge_index, extra], dim=1)


class Molecules(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(2)
        self.graphs = []
        for i in range(size):
            n = 6 + i // 10  # sorted by size: 6..
            x = torch.randn(n, 8, generator=g)
            src = torch.randint(0, n, (2 * n,), generator=g)
            dst = torch.randint(0, n, (2 * n,), generator=g)
            edge_index = torch.stack([src, dst])
            if n > 14:
                edge_index = add_super_node(x, edge_index)
            self.graphs.append((x, edge_index, torch.tensor(i % 2)))

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, i: int):
        return self.graphs[i]


def collate(batch):
    xs, edges, ys, batch_vec, offset = [], [], [], [], 0
    for gid, (x, edge_index, y) in enumerate(batch):
        xs.append(x)
        edges.append(edge_index + offset)
        batch_vec.append(torch.full((x.shape[0],), gid))
        ys.append(y)
        offset += x.shape[0]
    return torch.cat(xs), torch.cat(edges, 1), torch.cat(batch_vec), torch.stack(ys)


class GCNConv(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.lin = nn.Linear(cin, cout)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index
        ones = torch.ones(dst.shape[0], device=x.device)
        deg = torch.zeros(x.shape[0], device=x.device).scatter_add_(0, dst, ones)  # reprocut: culprit
        norm = (deg[src].clamp(min=1) * deg[dst].clamp(min=1)).rsqrt()
        h = self.lin(x)
        out = torch.zeros_like(h).index_add_(0, dst, h[src] * norm[:, None])
        return out + h


class GCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(8, 32)
        self.conv2 = GCNConv(32, 32)
        self.head = nn.Linear(32, 2)

    def forward(self, x, edge_index, batch_vec, num_graphs: int):
        h = F.relu(self.conv1(x, edge_index))
        h = F.relu(self.conv2(h, edge_index))
        pooled = torch.zeros(num_graphs, h.shape[1], device=h.device).index_add_(0, batch_vec, h)
        return self.head(pooled)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GCN().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(Molecules(160), batch_size=args.batch_size, collate_fn=collate)
    for step, (x, edge_index, batch_vec, y) in enumerate(loader):
        x, edge_index = x.to(args.device), edge_index.to(args.device)
        batch_vec, y = batch_vec.to(args.device), y.to(args.device)
        loss = F.cross_entropy(model(x, edge_index, batch_vec, y.shape[0]), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
