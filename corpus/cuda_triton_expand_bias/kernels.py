"""A fused "add conditioning" Triton kernel, written for contiguous inputs.

It walks both inputs with one flat offset, so it silently assumes `cond` has the same layout as
`x`. Fed an expand()ed tensor (stride 0 over tokens), it reads far past cond's storage.
"""

from __future__ import annotations

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
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        add_cond_kernel[grid](x, cond, out, n, BLOCK=1024)  # reprocut: culprit
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad


def add_cond(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return AddCond.apply(x, cond)
