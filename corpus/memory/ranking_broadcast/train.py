"""Learning-to-rank with a listwise squared loss per query. The model scores a query's
impressions as (n, 1); the relevance labels come as (n,). Small queries broadcast silently to
(n, n); at step 6 a query with 250,000 impressions asks for 232.83 GiB."""

import argparse

import torch
from torch import nn


def queries(device: str, generator: torch.Generator):
    sizes = [48, 64, 32, 80, 56, 40, 250_000, 64]
    for n in sizes:
        features = torch.randn(n, 16, generator=generator)
        relevance = torch.randint(0, 4, (n,), generator=generator).float()
        yield features.to(device), relevance.to(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    for step, (features, relevance) in enumerate(queries(args.device, generator)):
        scores = model(features)  # (n, 1)
        loss = ((scores - relevance) ** 2).mean()  # reprocut: culprit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"query {step}: {features.shape[0]} impressions, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
