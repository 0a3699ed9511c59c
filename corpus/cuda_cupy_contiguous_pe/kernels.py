"""A fused "add positional encoding + scale" CuPy kernel (an in-house extension).

The kernel indexes both inputs as flat, contiguous buffers of x.numel() elements; the wrapper
does not call .contiguous() on the encoding, to "avoid a copy".
"""

from __future__ import annotations

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
    out = torch.empty_like(x)
    n = x.numel()
    threads = 256
    blocks = (n + threads - 1) // threads
    args = (
        cupy.asarray(x.detach()), cupy.asarray(pe.detach()), cupy.asarray(out),
        np.float32(scale), np.int64(n),
    )
    _KERNEL((blocks,), (threads,), args)  # reprocut: culprit
    return out
