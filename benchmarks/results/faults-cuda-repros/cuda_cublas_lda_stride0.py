
import torch

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
x = torch.randn((128,), dtype=torch.float32, device='cuda:0').as_strided((64, 128), (0, 1), 0)
m, k = x.shape
w = torch.randn((256, 128), dtype=torch.float32, device='cuda:0')
n = w.shape[0]
y = torch.empty(m, n, device=x.device, dtype=torch.float32)
handle = cupy.cuda.device.get_cublas_handle()
cublas.sgemm(
    handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k,
    _ONE.ctypes.data, w.data_ptr(), w.stride(0),
    x.data_ptr(), x.stride(0),
    _ZERO.ctypes.data, y.data_ptr(), n,
)
torch.cuda.synchronize()
