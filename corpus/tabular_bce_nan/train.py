"""Train a churn model (multi-label: churn, upgrade, complaint) on a tabular feature table.

Bug: one customer row has a missing value (NaN) in "tenure_months", the scaler passes it
through, the MLP turns it into a NaN probability, and nn.BCELoss rejects it at step 7.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = ["tenure_months", "monthly_charges", "support_calls", "num_products", "age", "usage"]


def load_table(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(21)
    x = torch.rand(rows, len(FEATURES), generator=g) * torch.tensor([72, 120, 10, 4, 60, 500])
    x[230, 0] = float("nan")  # a row where tenure was never filled in
    y = (torch.rand(rows, 3, generator=g) < 0.2).float()
    return x, y


class Standardize(nn.Module):
    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", torch.nanmean(x, dim=0))
        self.register_buffer("std", x[~x.isnan().any(1)].std(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class ChurnNet(nn.Module):
    def __init__(self, scaler: Standardize) -> None:
        super().__init__()
        self.scaler = scaler
        self.mlp = nn.Sequential(nn.Linear(len(FEATURES), 32), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.mlp(self.scaler(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = load_table(320)
    model = ChurnNet(Standardize(x)).to(args.device)
    criterion = nn.BCELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size)
    step = 0
    for epoch in range(args.epochs):
        for features, targets in loader:  # reprocut: nan origin
            features, targets = features.to(args.device), targets.to(args.device)
            probs = model(features)
            loss = criterion(probs, targets)  # reprocut: culprit
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step} bce {loss.item():.4f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
