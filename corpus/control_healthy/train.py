"""Negative control: a healthy text-classification run that must not be reported as failing.

A bag-of-embeddings classifier with every id in range, every target valid and no NaN; it
trains for a few steps and exits 0. reprocut record must say there is nothing to reproduce.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB, CLASSES = 800, 5


class BagClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(ids))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (256, 20))
    labels = torch.randint(0, CLASSES, (256,))
    loader = DataLoader(TensorDataset(ids, labels), batch_size=32, shuffle=True)
    model = BagClassifier().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(args.device), y.to(args.device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
