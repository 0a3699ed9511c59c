
import torch

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
queries = torch.randn((32, 64), dtype=torch.float32, device='cuda:0')
m, d = queries.shape
keys = torch.randn((32768,), dtype=torch.float32, device='cuda:0').as_strided((512, 64), (1, 512), 0)
n = keys.shape[0]
out = torch.empty(m, n, device=queries.device, dtype=torch.float32)
handle = cupy.cuda.device.get_cublas_handle()
cublas.sgemm(
    handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, d,
    _ONE.ctypes.data, keys.data_ptr(), keys.stride(0),
    queries.data_ptr(), queries.stride(0),
    _ZERO.ctypes.data, out.data_ptr(), n,
)
torch.cuda.synchronize()
