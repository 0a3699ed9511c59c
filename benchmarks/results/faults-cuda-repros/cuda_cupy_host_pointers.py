"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in gather_rows_kernel
  thread (0,0,0) in block (148,0,0): reads 4 B at 960.6 TiB after the end of `table`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  at least 20 errors (memcheck stopped after printing them)
"""

import torch

import cupy

torch.manual_seed(0)

_SOURCE = r"""
extern "C" __global__ void gather_rows_kernel(const long long* ids, const float* table,
                                              float* out, long long n, int dim) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * dim) return;
    long long row = ids[i / dim];  // unchecked: assumed < rows
    out[i] = table[row * dim + i % dim];
}
"""
_KERNEL = cupy.RawKernel(_SOURCE, "gather_rows_kernel")
ids = torch.randint(22, 8589985559, (512,), device='cuda:0')
table = torch.randn((50000, 64), device='cuda:0')
out = torch.empty(ids.numel(), device=table.device)
n, dim = ids.numel(), table.shape[0]
pointers = (ids.data_ptr(), table.data_ptr(), out.data_ptr(), n, dim)
_KERNEL((n,), (1,), pointers)
torch.cuda.synchronize()
