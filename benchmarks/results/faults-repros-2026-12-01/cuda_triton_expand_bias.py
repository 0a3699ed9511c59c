"""Train a conditioned token decoder with classifier-free-guidance dropout (CUDA only).

Bug: on normal steps the conditioning is computed per token (a contiguous (B, T, D) tensor).
From step 5 on, every other batch is "unconditional": the code uses the learned null
conditioning expanded over tokens, `null.expand(B, T, D)` (stride 0 over T, 4 MB of storage
for a 1 GB logical tensor). The Triton kernel ignores strides and reads 1 GB from that storage:
an illegal memory access, reported at a later op unless launches are blocking.

compute-sanitizer (memcheck):
  Invalid __global__ read of size 16 bytes in add_cond_kernel
  thread (0,0,0) in block (2202,0,0): reads 16 B at 726.6 MiB after the end of `x`
  host: launch < (anonymous namespace)::THPFunction_apply(_object*, _object*) < [libc.so.6] < __libc_start_main
  180804 error(s) in all
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
"""A fused "add conditioning" Triton kernel, written for contiguous inputs.

It walks both inputs with one flat offset, so it silently assumes `cond` has the same layout as
`x`. Fed an expand()ed tensor (stride 0 over tokens), it reads far past cond's storage.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_cond_kernel(x_ptr, c_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x + c, mask=mask)


class AddCond(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0'))
        n = torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0').numel()
        grid = (triton.cdiv(n, 1024),)
        add_cond_kernel[grid](torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0'), torch.randn((1048576,), dtype=torch.float32, device='cuda:0').as_strided((256, 256, 4096), (4096, 0, 1), 0), out, n, BLOCK=1024)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad


def add_cond(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return AddCond.apply(x, cond)

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
torch.cuda.synchronize()
