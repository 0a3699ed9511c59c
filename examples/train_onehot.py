"""Train a tabular click model that one-hot encodes a categorical column.

The bug: `num_classes` for the "country" column was taken from the training split (12
countries); a later batch holds country 12, seen only once. `F.one_hot` is a composite op: on
CPU no aten op raises (the check happens in Python-visible code after `.item()`), on CUDA the
`scatter_` inside it asserts.

On CPU:   RuntimeError: Class values must be smaller than num_classes.
On CUDA:  Assertion `idx_dim >= 0 && idx_dim < index_size && ...` failed (reported later).

    python examples/train_onehot.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

NUM_COUNTRIES = 12  # counted on the training split


class ClickModel(nn.Module):
    def __init__(self, num_numeric: int, num_countries: int) -> None:
        super().__init__()
        self.num_countries = num_countries
        self.mlp = nn.Sequential(
            nn.Linear(num_numeric + num_countries, 32), nn.ReLU(), nn.Linear(32, 1)
        )

    def forward(self, numeric: torch.Tensor, country: torch.Tensor) -> torch.Tensor:
        country_vec = F.one_hot(country, self.num_countries).float()  # reprocut: culprit
        return self.mlp(torch.cat([numeric, country_vec], dim=1)).squeeze(1)


def make_dataset(size: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    numeric = torch.randn(size, 6, generator=generator)
    country = torch.randint(0, NUM_COUNTRIES, (size,), generator=generator)
    country[165] = NUM_COUNTRIES  # a country that only appears later: batch 165 // 32 = 5
    clicks = (torch.rand(size, generator=generator) < 0.3).float()
    return TensorDataset(numeric, country, clicks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ClickModel(num_numeric=6, num_countries=NUM_COUNTRIES).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(make_dataset(320), batch_size=args.batch_size)

    step = 0
    for _epoch in range(args.epochs):
        for numeric, country, clicks in loader:
            numeric, country = numeric.to(args.device), country.to(args.device)
            clicks = clicks.to(args.device)
            loss = F.binary_cross_entropy_with_logits(model(numeric, country), clicks)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step:3d} loss {loss.item():.4f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
