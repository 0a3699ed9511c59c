"""`qknorm::rms_scale`: RMS-normalizes the last dimension and scales it by a learned weight
(QK-norm), as a Triton kernel registered with `torch.library.triton_op` so torch.compile can
trace it, with a backward in torch. On machines without Triton the plain torch version below
is used instead.

The kernel walks rows of the last dimension with one row stride, `x.stride(-2)`: right for a
contiguous tensor, where every row starts `n_cols` after the previous one. Handed a transposed
(B, H, T, D) view of a (B, T, H, D) tensor, that stride is H * D: row r is read at r * H * D
instead of its place, and the rows run on to H times the tensor's size, far past its end.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch version below
    triton = None

import torch

EPS = 1e-6

if triton is not None:

    @triton.jit
    def rms_scale_kernel(x_ptr, w_ptr, out_ptr, row_stride, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=0.0)
        mean_square = tl.sum(x * x, axis=0) / n_cols
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        y = x * tl.rsqrt(mean_square + eps) * w
        tl.store(out_ptr + row * n_cols + cols, y, mask=mask)

    @torch.library.triton_op("qknorm::rms_scale", mutates_args={})
    def rms_scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        n_cols = x.shape[-1]
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        rows = x.numel() // n_cols
        block = triton.next_power_of_2(n_cols)
        torch.library.wrap_triton(rms_scale_kernel)[(rows,)](
            x, weight, out, x.stride(-2), n_cols, EPS, BLOCK=block
        )
        return out

    def _setup(ctx, inputs, output) -> None:
        x, weight = inputs
        ctx.save_for_backward(x, weight)

    def _backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        scaled = grad * weight
        grad_x = r * scaled - x * r.pow(3) * (x * scaled).mean(-1, keepdim=True)
        grad_weight = (grad * x * r).reshape(-1, x.shape[-1]).sum(0)
        return grad_x, grad_weight

    rms_scale.register_autograd(_backward, setup_context=_setup)

else:

    def rms_scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight
