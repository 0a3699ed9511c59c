"""Train a gated MLP block under torch.compile, its gate a Triton operator (CUDA only).

The gating is `fused::gated` (kernels.py), a `torch.library.triton_op` that torch.compile traces
into its graph. Bug: from step 4 on, the model switches to a shared learned gate,
`gate_bias.expand_as(h)` (stride 0: 16 KiB of storage for a 512 MiB logical tensor); the kernel
ignores strides and reads 512 MiB from that storage: an illegal memory access.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import gated

B, T, D = 128, 256, 4096


class GatedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(64, D)
        self.gate_net = nn.Linear(64, D)
        self.gate_bias = nn.Parameter(torch.zeros(D))
        self.out = nn.Linear(D, 64)

    def forward(self, x: torch.Tensor, shared_gate: bool) -> torch.Tensor:
        h = self.inp(x)
        gate = self.gate_bias.expand_as(h) if shared_gate else self.gate_net(x)
        return self.out(F.gelu(gated(h, gate)))  # reprocut: culprit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GatedBlock().to(args.device)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        x = torch.randn(B, T, 64, device=args.device)
        loss = F.mse_loss(compiled(x, shared_gate=step >= 4), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
