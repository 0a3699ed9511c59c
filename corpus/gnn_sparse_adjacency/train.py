"""Train a two-layer GCN on subgraphs sampled from a large citation graph (CPU or CUDA).

Each step samples 1200 papers of a crawl keyed by Microsoft Academic Graph paper ids (about 2e9
to 3.3e9) and relabels the citations among them from paper ids to rows of the sampled feature
matrix. Bug: from step 7 on, the crawler appends citations to papers outside the sample, and
`to_local` keeps an id it cannot find as it is ("fetched later"), so paper ids of ~3e9 enter a
1200 x 1200 sparse adjacency, built coalesced (sorted unique edges, `is_coalesced=True`). The
COO constructor does not check its indices: on CPU torch.sparse.mm raises at once ("index out
of column bound"); on CUDA the column ids go to cuSPARSE as 32-bit ints, and it reads ~1e9 rows
(over 100 GB) away from the feature matrix, outside any allocation: an illegal memory access.
(Built without `is_coalesced=True`, nothing faulted on the H200: torch's CUDA coalesce likely
folds the column overflow into row ids past the end, which the CSR conversion drops.)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

FEATURES, CLASSES, NODES = 32, 5, 1200
FIRST_ID, LAST_ID = 2_000_000_000, 3_300_000_000  # the range of the crawl's paper ids


def sample_subgraph(
    step: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Global ids of the sampled papers (sorted) and the citations among them, as global ids."""
    sample = torch.randint(FIRST_ID, LAST_ID, (NODES,), generator=g).unique()
    edges = 6000 + 100 * step
    src = sample[torch.randint(0, sample.numel(), (edges,), generator=g)]
    dst = sample[torch.randint(0, sample.numel(), (edges,), generator=g)]
    if step >= 7:  # newly crawled citations, to papers outside the sample
        dst[-40:] = torch.randint(FIRST_ID, LAST_ID, (40,), generator=g)
    return sample, src, dst


def to_local(sample: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Global paper ids -> rows of the sampled feature matrix."""
    local = torch.searchsorted(sample, ids)
    found = sample[local.clamp(max=sample.numel() - 1)] == ids
    return torch.where(found, local, ids)  # not in the sample: kept as is, to be fetched later


def graph_batch(step: int, device: str):
    """Features, normalized adjacency (sparse COO) and labels of the subgraph sampled at `step`."""
    g = torch.Generator().manual_seed(step)
    sample, src, dst = sample_subgraph(step, g)
    nodes = sample.numel()
    loops = torch.arange(nodes)
    rows = torch.cat([to_local(sample, src), loops])
    cols = torch.cat([to_local(sample, dst), loops])
    # unique (row, col) pairs, sorted by row then column: the adjacency is coalesced already,
    # and saying so spares torch a sort of every step's edges
    edges = torch.unique(torch.stack([rows, cols]), dim=1)
    rows = edges[0]
    degree = torch.bincount(rows, minlength=nodes).clamp(min=1).float()
    weights = 1.0 / degree[rows]
    adj = torch.sparse_coo_tensor(edges, weights, (nodes, nodes), is_coalesced=True)
    x = torch.randn(nodes, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (nodes,), generator=g)
    return x.to(device), adj.to(device), y.to(device)


class GCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(FEATURES, 64)
        self.lin2 = nn.Linear(64, CLASSES)

    def propagate(self, adj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adj, h)  # reprocut: culprit

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.lin1(self.propagate(adj, x)))
        return self.lin2(self.propagate(adj, h))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GCN().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        x, adj, y = graph_batch(step, args.device)
        loss = F.cross_entropy(model(x, adj), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
