"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in add_pe_scale
  thread (0,0,0) in block (1051809,0,0): reads 4 B 4.0 MiB into the 1.0 GiB storage of `args[1]`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  at least 20 errors (memcheck stopped after printing them)
"""

import torch

import cupy

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
out = torch.randn((256, 256, 4096), device='cuda:0')
args = (
    cupy.asarray(torch.randn((256, 256, 4096), device='cuda:0')), cupy.asarray(torch.randn((1048576,), device='cuda:0').as_strided((256, 256, 4096), (0, 4096, 1)).detach()), cupy.asarray(out),
    64.0, 6291456,
)
_KERNEL((6291456,), (1,), args)
torch.cuda.synchronize()
