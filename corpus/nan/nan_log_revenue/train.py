"""Forecast weekly store revenue with a log-normal regression.

Bug: the target is log(revenue). One store closed for a renovation week and reported revenue
0.0; that row is in the batch of step 9, log(0) = -inf, the MSE is inf, and the script's own
guard raises "loss is inf". Nothing in torch failed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

FEATURES = ["footfall", "area_m2", "staff", "promo", "season", "competitors"]


def load_sales(weeks: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(weeks * batch, len(FEATURES), generator=g)
    true_w = torch.tensor([0.8, 0.3, 0.2, 0.5, -0.1, -0.4])
    revenue = torch.exp(x @ true_w + 9.0 + 0.1 * torch.randn(weeks * batch, generator=g))
    revenue[9 * batch + 11] = 0.0  # closed for renovation: no sales that week
    return x, revenue


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, revenue = load_sales(args.steps, args.batch_size)
    model = nn.Sequential(nn.Linear(len(FEATURES), 32), nn.Tanh(), nn.Linear(32, 1)).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
        feats, sales = x[rows].to(args.device), revenue[rows].to(args.device)
        pred = model(feats).squeeze(-1)
        target = torch.log(sales)  # reprocut: nan origin
        loss = F.mse_loss(pred, target)
        if not torch.isfinite(loss):
            raise RuntimeError(f"loss is {loss.item()} at step {step}, stopping")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} mse {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
