"""Query-key scores through cuBLAS directly (CuPy's bindings), for a retrieval scorer.

Row-major S = Q @ K.T is computed as the column-major GEMM S^T = K (op T) Q. The wrapper passes
`keys.stride(0)` as K's leading dimension, assuming a row-major (N, D) matrix; cuBLAS requires
it to be at least D.
"""

from __future__ import annotations

import cupy
import numpy as np
import torch
from cupy_backends.cuda.libs import cublas

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


def scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(M, D) float32 queries x (N, D) float32 keys -> (M, N) dot products."""
    m, d = queries.shape
    n = keys.shape[0]
    out = torch.empty(m, n, device=queries.device, dtype=torch.float32)
    torch.cuda.current_stream().synchronize()  # CuPy uses its own stream
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.sgemm(  # reprocut: culprit
        handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, d,
        _ONE.ctypes.data, keys.data_ptr(), keys.stride(0),
        queries.data_ptr(), queries.stride(0),
        _ZERO.ctypes.data, out.data_ptr(), n,
    )  # fmt: skip
    cupy.cuda.get_current_stream().synchronize()
    return out
