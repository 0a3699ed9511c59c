"""A two-layer hand-written attention encoder trained with a sequence-length curriculum. Each
layer keeps its (B*H, T, T) float32 softmax for backward; at T = 8192 (step 6) the two layers
hold 72 GiB and the backward of the second needs two more 36 GiB score gradients."""

import argparse
import math

import torch
from torch import nn


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    batch, heads, dim = 12, 12, 768  # B * H = 144
    model = nn.Sequential(Attention(dim, heads), Attention(dim, heads)).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, length in enumerate([512, 512, 1024, 1024, 2048, 4096, 8192]):
        x = torch.randn(batch, length, dim, device=args.device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}: T={length} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
