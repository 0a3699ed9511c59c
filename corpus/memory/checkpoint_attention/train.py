"""A hand-written attention encoder with activation checkpointing (`torch.utils.checkpoint`,
non-reentrant) and a sequence-length curriculum. Checkpointing keeps only each block's input for
backward, so the forward at T = 8192 fits: its (B*H, T, T) float32 scores (48 GiB each, B*H =
192) live only inside the block. The backward recomputes the block and then needs its softmax
output, that output's gradient and the softmax backward's result at once: three 48 GiB tensors
on a 139.8 GiB H200, so `_softmax_backward_data` asks 48 GiB with 96 GiB held."""

import argparse
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        q, k, v = (z.reshape(b * self.heads, t, -1) for z in (q, k, v))
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        attn = scores.softmax(dim=-1)  # reprocut: culprit
        y = torch.bmm(attn, v).reshape(b, self.heads, t, -1).transpose(1, 2).reshape(b, t, d)
        return x + self.out(y)


class Encoder(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Attention(dim, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)  # activations recomputed in backward
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    batch, heads, dim = 16, 12, 768  # B * H = 192
    model = Encoder(dim, heads, layers=2).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, length in enumerate([512, 1024, 2048, 4096, 8192]):
        x = torch.randn(batch, length, dim, device=args.device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}: T={length} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
