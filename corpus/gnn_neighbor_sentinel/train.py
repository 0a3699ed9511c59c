"""Train GraphSAGE on a citation graph with a fixed-fanout neighbour sampler.

Bug: the sampler pads nodes that have fewer than `fanout` neighbours with the sentinel -1, and
the aggregator gathers neighbour features with index_select, which does not accept -1. The
first seed batch that contains a low-degree node is step 4.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_NODES, FANOUT = 400, 4


def build_graph() -> list[list[int]]:
    g = torch.Generator().manual_seed(9)
    neighbours = []
    for node in range(NUM_NODES):
        degree = 2 if node in (150, 301) else 4 + node % 5  # two poorly-cited papers
        neighbours.append(torch.randint(0, NUM_NODES, (degree,), generator=g).tolist())
    return neighbours


def sample_neighbours(seeds: torch.Tensor, adjacency: list[list[int]]) -> torch.Tensor:
    rows = []
    for node in seeds.tolist():
        nbrs = adjacency[node][:FANOUT]
        rows.append(nbrs + [-1] * (FANOUT - len(nbrs)))  # pad with a sentinel
    return torch.tensor(rows)


class SAGELayer(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.self_lin = nn.Linear(cin, cout)
        self.nbr_lin = nn.Linear(cin, cout)

    def forward(self, x: torch.Tensor, seeds: torch.Tensor, nbrs: torch.Tensor) -> torch.Tensor:
        nbr_feats = x.index_select(0, nbrs.flatten())  # reprocut: culprit
        agg = nbr_feats.view(*nbrs.shape, -1).mean(1)
        return self.self_lin(x[seeds]) + self.nbr_lin(agg)


class GraphSAGE(nn.Module):
    def __init__(self, cin: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.sage = SAGELayer(cin, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, x, seeds, nbrs):
        return self.classifier(F.relu(self.sage(x, seeds, nbrs)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    adjacency = build_graph()
    features = torch.randn(NUM_NODES, 16).to(args.device)
    labels = torch.randint(0, 5, (NUM_NODES,)).to(args.device)
    model = GraphSAGE(16, 32, 5).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    step = 0
    for epoch in range(args.epochs):
        for start in range(0, NUM_NODES, args.batch_size):
            seeds = torch.arange(start, min(start + args.batch_size, NUM_NODES))
            nbrs = sample_neighbours(seeds, adjacency).to(args.device)
            seeds = seeds.to(args.device)
            loss = F.cross_entropy(model(features, seeds, nbrs), labels[seeds])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
