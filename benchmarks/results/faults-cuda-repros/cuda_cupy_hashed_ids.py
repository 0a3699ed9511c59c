"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in hashed_bag
  thread (0,0,0) in block (0,0,0): reads 4 B at 1.5 TiB after the end of `args[1]`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  6 error(s) in all
"""

import torch

import cupy

torch.manual_seed(0)

_SOURCE = r"""
extern "C" __global__ void hashed_bag(const long long* __restrict__ ids,
                                      const float* __restrict__ table,
                                      float* __restrict__ out,
                                      int n_bags, int dim, int bag) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per (bag, feature dim)
    if (i >= n_bags * dim) return;
    int b = i / dim, d = i % dim;
    float total = 0.0f;
    for (int j = 0; j < bag; ++j) {
        long long row = ids[(long long)b * bag + j];  // unchecked: assumed < rows
        total += table[row * dim + d];
    }
    out[i] = total / bag;
}
"""
_KERNEL = cupy.RawKernel(_SOURCE, "hashed_bag")
n_bags, bag = (1, 1)
args = (cupy.asarray(torch.randint(53, 1098525229974, (256, 7), device='cuda:0').contiguous()), cupy.asarray(torch.randn((65536, 32), device='cuda:0')), cupy.asarray(n_bags),
        n_bags, 1, bag)
_KERNEL((n_bags,), (1,), args)
torch.cuda.synchronize()
