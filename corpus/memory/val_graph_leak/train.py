"""Regression MLP with a validation pass every step; the validation losses are kept for a
plot at the end, with their autograd graphs: no torch.no_grad() and no .item()."""

import argparse

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


def batches(n: int, features: int, device: str, generator: torch.Generator):
    w = torch.randn(features, generator=generator)
    for _ in range(n):
        x = torch.randn(256, features, generator=generator)
        yield x.to(device), (x @ w).to(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    cuda = args.device.startswith("cuda")
    # on an H200, about 8 GiB of validation activations a step (two (131072, 8192) float32
    # ReLU outputs): out of memory at about step 15 of 24
    features, hidden, val_rows = (1024, 8192, 131072) if cuda else (32, 512, 2048)
    steps = args.steps or (24 if cuda else 12)
    model = Regressor(features, hidden).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    val_x = torch.randn(val_rows, features, generator=generator).to(args.device)
    val_y = val_x.sum(dim=1)
    history = []
    for step, (x, y) in enumerate(batches(steps, features, args.device, generator)):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        val_loss = nn.functional.mse_loss(model(val_x), val_y)
        history.append(val_loss)  # keeps the whole validation graph alive
        print(f"step {step}: train {loss.item():.3f}")
    print("best validation loss", min(v.item() for v in history))


if __name__ == "__main__":
    main()
