"""Gradient accumulation by summing the micro-batches' losses: `total_loss += loss / window`
keeps every micro-batch's autograd graph, with the activations it saved, until the one
backward at the end of the window. The window grows with the run (8, 16, 32, then 160
micro-batches: an effective-batch-size warmup). Each micro-batch saves a (16384, 16384) float32
ReLU output (1 GiB), so in the 160-micro-batch window a forward runs out of memory with about
130 micro-batches' activations held by `total_loss` on a 139.8 GiB H200. Memory does not grow
from window to window: it is held within one, and no leak should be claimed."""

import argparse

import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(features, hidden)
        self.down = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.up(x))  # reprocut: culprit
        return self.down(hidden).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Ranker(256, 16384).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, window in enumerate([8, 16, 32, 160]):
        total_loss = 0.0
        for _ in range(window):
            x = torch.randn(16384, 256, device=args.device)
            y = torch.randn(16384, device=args.device)
            loss = nn.functional.mse_loss(model(x), y)
            total_loss += loss / window  # keeps this micro-batch's graph until the backward
        optimizer.zero_grad(set_to_none=True)
        total_loss.backward()
        optimizer.step()
        print(f"step {step}: {window} micro-batches, loss {total_loss.item():.4f}")


if __name__ == "__main__":
    main()
