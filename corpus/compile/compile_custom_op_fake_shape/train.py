"""Training with a compiled logging metric around a custom op whose fake implementation is wrong.

`trim_last` drops the last row of its input (the padding row the data loader appends); its
registered fake (meta) implementation says the output keeps the input's shape. Eagerly only the
real op runs and everything works. Under torch.compile, Inductor plans the graph with the fake's
shape and checks the real output against it at run time (`AssertionError: expected size 7==8`):
only the compiled run fails.
"""

import argparse

import torch
from torch import nn


@torch.library.custom_op("corpus::trim_last", mutates_args=())
def trim_last(x: torch.Tensor) -> torch.Tensor:
    return x[:-1].clone()


@trim_last.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)  # wrong: the real op returns one row fewer


@torch.compile
def pooled_stats(hidden: torch.Tensor) -> torch.Tensor:
    return trim_last(hidden).abs().mean(0)  # reprocut: culprit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.randn(8, 4, device=args.device)
        x[-1] = 0  # the padding row
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            stats = pooled_stats(model[0](x))
        print(f"step {step} loss {loss.item():.3f} activation {stats.mean().item():.3f}")


if __name__ == "__main__":
    main()
