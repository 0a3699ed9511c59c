"""Train a conditioned token decoder with classifier-free-guidance dropout (CUDA only).

Bug: on normal steps the conditioning is computed per token (a contiguous (B, T, D) tensor).
From step 5 on, every other batch is "unconditional": the code uses the learned null
conditioning expanded over tokens, `null.expand(B, T, D)` (stride 0 over T, 4 MB of storage
for a 1 GB logical tensor). The Triton kernel ignores strides and reads 1 GB from that storage:
an illegal memory access, reported at a later op unless launches are blocking.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import add_cond

B, T, D, F_IN = 256, 256, 4096, 32


class CondDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(F_IN, D)
        self.cond_net = nn.Linear(F_IN, D)
        self.null_cond = nn.Parameter(torch.zeros(B, 1, D))
        self.out = nn.Linear(D, F_IN)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, unconditional: bool) -> torch.Tensor:
        h = self.inp(x)
        if unconditional:
            cond = self.null_cond.expand(-1, x.shape[1], -1)
        else:
            cond = self.cond_net(ctx)
        return self.out(F.gelu(add_cond(h, cond)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cfg-start", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = CondDecoder().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        x = torch.randn(B, T, F_IN, device=args.device)
        ctx = torch.randn(B, T, F_IN, device=args.device)
        unconditional = step >= args.cfg_start and step % 2 == 1
        loss = F.mse_loss(model(x, ctx, unconditional), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} uncond={unconditional} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
