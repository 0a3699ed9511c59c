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

DIM, DOCS, BATCH, VOCAB = 64, 512, 32, 1000
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
