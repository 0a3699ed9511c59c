"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in add_pe_scale
  thread (96,0,0) in block (4515,0,0): reads 4 B at 419.4 KiB after the end of `pe`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  at least 20 errors (memcheck stopped after printing them)
"""

import torch

import cupy
import numpy as np

torch.manual_seed(0)

_KERNEL = cupy.RawKernel(
    r"""
extern "C" __global__ void add_pe_scale(const float* x, const float* pe, float* out,
                                        float scale, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * scale + pe[i];
}
""",
    "add_pe_scale",
)
x = torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0')
out = torch.empty_like(x)
n = x.numel()
threads = 256
blocks = (n + threads - 1) // threads
pe = torch.randn((1048576,), dtype=torch.float32, device='cuda:0').as_strided((256, 256, 4096), (0, 4096, 1), 0)
scale = 64.0
args = (
    cupy.asarray(x.detach()), cupy.asarray(pe.detach()), cupy.asarray(out),
    np.float32(scale), np.int64(n),
)
_KERNEL((blocks,), (threads,), args)
torch.cuda.synchronize()
