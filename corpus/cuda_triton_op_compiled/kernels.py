"""`fused::gated`, a Triton kernel registered as a PyTorch operator with
`torch.library.triton_op` and launched through `wrap_triton`, so `torch.compile` can trace it.

The kernel walks `x` and `gate` with one flat offset: it assumes `gate` has x's layout. Fed an
expand()ed gate (stride 0 over batch and tokens) it reads far past the gate's storage.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def gated_kernel(x_ptr, g_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x * tl.sigmoid(g), mask=mask)


@torch.library.triton_op("fused::gated", mutates_args={})
def gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(gated_kernel)[(triton.cdiv(n, 1024),)](x, gate, out, n, BLOCK=1024)
    return out


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor):
    x, gate = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * s, grad * x * s * (1 - s)


gated.register_autograd(_backward, setup_context=_setup)
