"""Train a multi-task recommender with a LARS optimizer (layer-wise trust ratios).

Bug: the trust ratio is ||w|| / ||g|| with no guard. At step 7 every sample of the batch is
masked out (a day with no labelled clicks), the masked loss is 0, every gradient is exactly 0,
||g|| = 0, the trust ratio is inf and inf * 0 = NaN goes into every weight. The loss prints nan
from step 8 on; the script finishes without an error.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.1, trust: float = 0.001) -> None:
        super().__init__(params, {"lr": lr, "trust": trust})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                ratio = group["trust"] * p.norm() / p.grad.norm()  # reprocut: nan origin
                p.add_(p.grad * ratio, alpha=-group["lr"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(9)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1)).to(args.device)
    optimizer = LARS(model.parameters(), lr=1.0)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 20, generator=g).to(args.device)
        clicked = (torch.rand(args.batch_size, generator=g) < 0.3).float().to(args.device)
        labelled = (torch.rand(args.batch_size, generator=g) < 0.8).float().to(args.device)
        if step == 7:
            labelled.zero_()  # no labels were logged that day
        per_sample = nn.functional.binary_cross_entropy_with_logits(
            model(x).squeeze(-1), clicked, reduction="none"
        )
        loss = (per_sample * labelled).sum() / labelled.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
