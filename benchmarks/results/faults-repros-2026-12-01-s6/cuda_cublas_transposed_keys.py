"""Train a query encoder against a memory bank of document keys, scored by a cuBLAS GEMM (CUDA).

Bug: from step 4 the bank is refreshed by `refresh_bank`, which keeps it feature-major (D, N)
for a cheaper momentum update and hands out `bank.t()`: a view with strides (1, N). The cuBLAS
wrapper passes keys.stride(0) = 1 as the leading dimension (it must be >= D), and cuBLAS rejects
the call with CUBLAS_STATUS_INVALID_VALUE: a genuine, synchronous library status error.
"""

from __future__ import annotations

import cupy
import numpy as np
import torch
from cupy_backends.cuda.libs import cublas

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
queries = torch.randn((32, 64), dtype=torch.float32, device='cuda:0')
m, d = queries.shape
keys = torch.randn((32768,), dtype=torch.float32, device='cuda:0').as_strided((512, 64), (1, 512), 0)
n = keys.shape[0]
out = torch.empty(m, n, device=queries.device, dtype=torch.float32)
torch.cuda.current_stream().synchronize()
handle = cupy.cuda.device.get_cublas_handle()
cublas.sgemm(
    handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, d,
    _ONE.ctypes.data, keys.data_ptr(), keys.stride(0),
    queries.data_ptr(), queries.stride(0),
    _ZERO.ctypes.data, out.data_ptr(), n,
)
torch.cuda.synchronize()
