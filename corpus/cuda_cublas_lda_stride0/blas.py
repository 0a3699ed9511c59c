"""A hand-rolled cuBLAS linear layer (called through CuPy's cuBLAS bindings).

Row-major y = x @ w.T is computed as column-major y^T = w^T(op T) x^T. The wrapper passes
x.stride(0) as the leading dimension, assuming a plain row-major matrix.
"""

from __future__ import annotations

import cupy
import numpy as np
import torch
from cupy_backends.cuda.libs import cublas

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


def _sgemm_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=torch.float32)
    torch.cuda.current_stream().synchronize()  # CuPy uses its own stream
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.sgemm(  # reprocut: culprit
        handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k,
        _ONE.ctypes.data, w.data_ptr(), w.stride(0),
        x.data_ptr(), x.stride(0),
        _ZERO.ctypes.data, y.data_ptr(), n,
    )
    cupy.cuda.get_current_stream().synchronize()
    return y


class CublasLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _sgemm_linear(x, w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        return grad @ w, grad.T @ x


class CublasLinear(torch.nn.Module):
    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(fan_out, fan_in) / fan_in**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return CublasLinearFn.apply(x, self.weight)
