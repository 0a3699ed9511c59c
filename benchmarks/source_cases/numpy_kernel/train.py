"""Train a small MLP whose hidden layer uses our fused bias + GELU kernel at evaluation."""

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from fusedext import fused_bias_gelu


class FusedMLP(nn.Module):
    def __init__(self, dim_in, hidden, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, hidden, bias=False)
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.out = nn.Linear(hidden, dim_out)

    def forward(self, x):
        hidden = self.proj(x)
        if self.training:
            hidden = torch.nn.functional.gelu(hidden + self.bias)
        else:
            out = fused_bias_gelu(hidden, self.bias.expand_as(hidden))
            hidden = out
        return self.out(hidden)


def batches(n, batch_size, dim):
    generator = torch.Generator().manual_seed(0)
    for _ in range(n):
        x = torch.randn(batch_size, dim, generator=generator)
        y = (x.sum(dim=1) > 0).long()
        yield x, y


def evaluate(model, data):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in data:
            correct += (model(x).argmax(dim=1) == y).sum().item()
            total += len(y)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    model = FusedMLP(32, args.hidden, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for x, y in batches(20, 16, 32):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        accuracy = evaluate(model, batches(4, 16, 32))
        print(f"epoch {epoch}: accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
