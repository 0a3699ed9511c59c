"""Train a query encoder against a memory bank of document keys, scored by a cuBLAS GEMM (CUDA).

Bug: from step 4 the bank is refreshed by `refresh_bank`, which keeps it feature-major (D, N)
for a cheaper momentum update and hands out `bank.t()`: a view with strides (1, N). The cuBLAS
wrapper passes keys.stride(0) = 1 as the leading dimension (it must be >= D), and cuBLAS rejects
the call with CUBLAS_STATUS_INVALID_VALUE: a genuine, synchronous library status error.
"""

from __future__ import annotations

import torch
"""Query-key scores through cuBLAS directly (CuPy's bindings), for a retrieval scorer.

Row-major S = Q @ K.T is computed as the column-major GEMM S^T = K (op T) Q. The wrapper passes
`keys.stride(0)` as K's leading dimension, assuming a row-major (N, D) matrix; cuBLAS requires
it to be at least D.
"""

import cupy
import numpy as np
import torch
from cupy_backends.cuda.libs import cublas

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
m, d = torch.randn((32, 64), dtype=torch.float32, device='cuda:0').shape
n = torch.randn((32768,), dtype=torch.float32, device='cuda:0').as_strided((512, 64), (1, 512), 0).shape[0]
out = torch.empty(m, n, device=torch.randn((32, 64), dtype=torch.float32, device='cuda:0').device, dtype=torch.float32)
torch.cuda.current_stream().synchronize()
handle = cupy.cuda.device.get_cublas_handle()
cublas.sgemm(
    handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, d,
    _ONE.ctypes.data, torch.randn((32768,), dtype=torch.float32, device='cuda:0').as_strided((512, 64), (1, 512), 0).data_ptr(), torch.randn((32768,), dtype=torch.float32, device='cuda:0').as_strided((512, 64), (1, 512), 0).stride(0),
    torch.randn((32, 64), dtype=torch.float32, device='cuda:0').data_ptr(), torch.randn((32, 64), dtype=torch.float32, device='cuda:0').stride(0),
    _ZERO.ctypes.data, out.data_ptr(), n,
)
torch.cuda.synchronize()
