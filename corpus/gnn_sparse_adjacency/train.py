"""Train a two-layer GCN on a growing citation graph held as a sparse adjacency (CPU or CUDA).

Bug: the crawler adds papers every few steps; `graph_batch` builds the normalized adjacency with
the node count of the feature matrix, but from step 7 on the edge list already cites papers
whose features have not been fetched yet (ids >= num_nodes). The COO constructor does not check
its indices, so torch.sparse.mm reads past the feature matrix: on CPU it raises at once
("index out of column bound"), on CUDA cuSPARSE faults with an illegal memory access.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

FEATURES, CLASSES, NODES = 32, 5, 1200


def graph_batch(step: int, device: str):
    """Features, normalized adjacency (sparse COO) and labels of the graph as crawled by `step`."""
    g = torch.Generator().manual_seed(step)
    nodes = NODES
    edges = 6000 + 100 * step
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    if step >= 7:  # newly crawled citations point at papers not fetched yet
        dst[-40:] = torch.randint(nodes, nodes + 50, (40,), generator=g)
    loops = torch.arange(nodes)
    rows = torch.cat([src, loops])
    cols = torch.cat([dst, loops])
    degree = torch.bincount(rows, minlength=nodes).clamp(min=1).float()
    weights = 1.0 / degree[rows]
    adj = torch.sparse_coo_tensor(torch.stack([rows, cols]), weights, (nodes, nodes))
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
