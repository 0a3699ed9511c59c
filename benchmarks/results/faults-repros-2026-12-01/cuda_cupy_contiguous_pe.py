"""Train a sequence autoencoder with a CuPy positional-encoding kernel (CUDA only).

Bug: training builds the positional encodings with `.repeat(B, 1, 1)` (a contiguous copy); the
evaluation path, written later "to save memory", uses `.expand(B, -1, -1)` (stride 0 over the
batch, 4 MB of storage for a 1 GB logical tensor). The kernel assumes contiguous inputs and
reads 1 GB from the 4 MB table at the first evaluation (after step 6, under torch.no_grad()).

compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in add_pe_scale
  thread (96,0,0) in block (8677,0,0): reads 4 B at 485.4 KiB after the end of `x`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
"""A fused "add positional encoding + scale" CuPy kernel (an in-house extension).

The kernel indexes both inputs as flat, contiguous buffers of x.numel() elements; the wrapper
does not call .contiguous() on the encoding, to "avoid a copy".
"""

import cupy
import numpy as np
import torch

_KERNEL = cupy.RawKernel(
    r"""
extern "C" __global__ void add_pe_scale(const float* x, const float* pe, float* out,
                                        float scale, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * scale + pe[i];
}
""",
    "add_pe_scale",
)


class AddPositional(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, pe: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return _launch(x, pe, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None, None


def add_positional(x: torch.Tensor, pe: torch.Tensor, scale: float) -> torch.Tensor:
    return AddPositional.apply(x, pe, scale)


def _launch(x: torch.Tensor, pe: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty_like(torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0'))
    n = torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0').numel()
    threads = 256
    blocks = (n + threads - 1) // threads
    args = (
        cupy.asarray(torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0').detach()), cupy.asarray(pe.detach()), cupy.asarray(out),
        np.float32(scale), np.int64(n),
    )
    _KERNEL((blocks,), (threads,), args)
    return out

B, T, D = 256, 256, 4096


def sinusoidal(t: int, d: int) -> torch.Tensor:
    pos = torch.arange(t)[:, None]
    div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = torch.zeros(t, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    return pe


class SeqAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pe", sinusoidal(T, D))
        self.inp = nn.Linear(16, D)
        self.out = nn.Linear(D, 16)

    def forward(self, x: torch.Tensor, memory_saving: bool = False) -> torch.Tensor:
        h = self.inp(x)
        if memory_saving:
            pe = self.pe[None].expand(x.shape[0], -1, -1)
        else:
            pe = self.pe[None].repeat(x.shape[0], 1, 1)
        return self.out(F.gelu(add_positional(h, pe, math.sqrt(D))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SeqAutoencoder().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        x = torch.randn(B, T, 16, device=args.device)
        loss = F.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                val = torch.randn(B, T, 16, device=args.device)
                val_loss = F.mse_loss(model(val, memory_saving=True), val)
            print(f"step {step} val loss {val_loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
torch.cuda.synchronize()
