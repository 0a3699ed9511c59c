"""Classify small molecules-like graphs with a two-layer message-passing network.

Nodes exchange messages along edges (index_add_), then each graph's nodes are mean-pooled by
the segment kernel in segops.py. Large graphs get a virtual "context" node, connected to all of
theirs, appended after the batch's nodes.
"""

from __future__ import annotations

import argparse

import torch
from segops import segment_mean
from torch import nn

FEATURES, HIDDEN, CLASSES = 8, 32, 3
VIRTUAL_FROM = 20  # graphs with more nodes than this get a context node


def make_graph(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    nodes = int(torch.randint(4, 24, (1,), generator=generator))
    feats = torch.randn(nodes, FEATURES, generator=generator)
    src = torch.randint(0, nodes, (2 * nodes,), generator=generator)
    dst = torch.randint(0, nodes, (2 * nodes,), generator=generator)
    label = int(feats[:, 0].mean() > 0) + int(nodes > 12)
    return feats, torch.stack([src, dst]), label


def collate(graphs: list[tuple[torch.Tensor, torch.Tensor, int]]):
    feats, edges, segments, labels, offset = [], [], [], [], 0
    for gid, (x, edge_index, label) in enumerate(graphs):
        feats.append(x)
        edges.append(edge_index + offset)
        segments.append(torch.full((len(x),), gid, dtype=torch.long))
        labels.append(label)
        offset += len(x)
    last_x = graphs[-1][0]
    if len(last_x) > VIRTUAL_FROM:  # a context node for the last graph, linked to its nodes
        first = offset - len(last_x)
        feats.append(last_x.mean(dim=0, keepdim=True))
        members = torch.arange(first, offset)
        edges.append(torch.stack([members, torch.full_like(members, offset)]))
        segments.append(torch.tensor([len(graphs)]))
    return torch.cat(feats), torch.cat(edges, dim=1), torch.cat(segments), torch.tensor(labels)


class MessagePassing(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.message = nn.Linear(dim_in, dim_out)
        self.update = nn.Linear(dim_in + dim_out, dim_out)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        messages = self.message(x)[edges[0]]
        summed = torch.zeros(len(x), messages.shape[1]).index_add_(0, edges[1], messages)
        return torch.relu(self.update(torch.cat([x, summed], dim=1)))


class GraphClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = MessagePassing(FEATURES, HIDDEN)
        self.layer2 = MessagePassing(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, edges, segments, count):
        hidden = self.layer2(self.layer1(x, edges), edges)
        return self.head(segment_mean(hidden, segments, count))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(7)
    model = GraphClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        graphs = [make_graph(generator) for _ in range(args.batch)]
        x, edges, segments, labels = collate(graphs)
        logits = model(x, edges, segments, len(graphs))
        loss = nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
