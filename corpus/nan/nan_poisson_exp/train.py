"""Predict daily bike rentals per station with a Poisson regression (log link).

Bug: the rate is exp(linear(features)). The batch of step 8 holds a station whose distance to
the city centre was logged in metres instead of kilometres (4200.0, not 4.2): its log-rate is
far above 88.72, exp overflows float32 to inf, the Poisson loss is inf and its gradient NaN.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn

FEATURES = ["temp_c", "rain_mm", "weekday", "holiday", "dist_km", "docks"]


class RentalModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(len(FEATURES), 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[0.05, -0.1, 0.02, 0.3, 0.03, 0.01]]))
            self.linear.bias.fill_(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_rate = self.linear(x).squeeze(-1)
        return torch.exp(log_rate)  # reprocut: nan origin


def stations(steps: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.rand(steps * batch, len(FEATURES), generator=g) * torch.tensor([30, 10, 6, 1, 8, 40])
    x[8 * batch + 3, 4] = 4200.0  # metres, not kilometres
    counts = torch.poisson(torch.full((steps * batch,), 12.0), generator=g)
    return x, counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, counts = stations(args.steps, args.batch_size)
    model = RentalModel().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    criterion = nn.PoissonNLLLoss(log_input=False)
    for step in range(args.steps):
        rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
        rate = model(x[rows].to(args.device))
        loss = criterion(rate, counts[rows].to(args.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} poisson nll {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
