"""Train a conditional policy head that uses a hand-rolled cuBLAS linear layer (CUDA only).

Bug: for "unconditional" batches (context dropout, from step 5 on, every other step) the
context is the learned null vector broadcast with `expand(B, K)`: stride 0 over rows. The
wrapper passes x.stride(0) = 0 as cuBLAS's leading dimension, and cuBLAS rejects the call with
CUBLAS_STATUS_INVALID_VALUE. A genuine, synchronous cuBLAS status error (no earlier fault).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from blas import CublasLinear

B, K, ACTIONS = 64, 128, 6


class PolicyHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ctx_proj = nn.Linear(32, K)
        self.null_ctx = nn.Parameter(torch.zeros(1, K))
        self.fc = CublasLinear(K, 256)
        self.logits = nn.Linear(256, ACTIONS)

    def forward(self, ctx: torch.Tensor, drop_context: bool) -> torch.Tensor:
        h = self.null_ctx.expand(ctx.shape[0], -1) if drop_context else self.ctx_proj(ctx)
        return self.logits(F.relu(self.fc(h)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = PolicyHead().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        ctx = torch.randn(B, 32, device=args.device)
        actions = torch.randint(0, ACTIONS, (B,), device=args.device)
        drop = step >= 5 and step % 2 == 1
        loss = F.cross_entropy(model(ctx, drop), actions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} drop_context={drop} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
