"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in hashed_bag
  thread (0,0,0) in block (8,0,0): reads 4 B at 97296.3 TiB after the end of `table`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  at least 20 errors (memcheck stopped after printing them)
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
ids = torch.randint(53, 1098525229974, (256, 7), device='cuda:0')
n_bags, bag = ids.shape
table = torch.randn((65536, 32), device='cuda:0')
dim = table.shape[0]
out = n_bags
blocks = n_bags
args = (cupy.asarray(ids), cupy.asarray(table), cupy.asarray(out),
        n_bags, dim, bag)
_KERNEL((blocks,), (1,), args)
torch.cuda.synchronize()
