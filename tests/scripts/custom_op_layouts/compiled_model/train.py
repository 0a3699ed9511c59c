"""A small transformer block under torch.compile whose attention bias comes from a custom op
(`relpos::bias`, with a fake for the compiler and a backward for the table). Bug: from step 3
the sequences grow to 12 tokens, and relative distances reach past the bias table's 8 buckets;
the op raises, compiled or not."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

BUCKETS = 8


@torch.library.custom_op("relpos::bias", mutates_args=())
def relative_bias(table: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    far = int(distance.max())
    if far >= table.shape[0]:
        raise IndexError(f"distance {far} is past the bias table's {table.shape[0]} buckets")
    return table[distance].clone()


@relative_bias.register_fake
def _(table: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    return table.new_empty(distance.shape)


def _setup(ctx, inputs, output) -> None:
    table, distance = inputs
    ctx.save_for_backward(distance)
    ctx.buckets = table.shape[0]


def _backward(ctx, grad: torch.Tensor):
    (distance,) = ctx.saved_tensors
    flat = grad.new_zeros(ctx.buckets).index_add_(0, distance.flatten(), grad.flatten())
    return flat, None


relative_bias.register_autograd(_backward, setup_context=_setup)


class Block(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.table = nn.Parameter(torch.zeros(BUCKETS))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        positions = torch.arange(x.shape[1], device=x.device)
        distance = (positions[:, None] - positions[None, :]).abs()
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores + relative_bias(self.table, distance)
        return self.out(F.softmax(scores, dim=-1) @ v)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Block()
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        tokens = 6 if step < 3 else 12
        x = torch.randn(2, tokens, 16)
        loss = F.mse_loss(compiled(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
