"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in add_cond_kernel
  thread (0,0,0) in block (1051565,0,0): reads 4 B at 0x7fa3f2802eb4
  host: launch < [libc.so.6] < __libc_start_main < __call__ in driver.py:713
  at least 20 errors (memcheck stopped after printing them)
"""

import torch
import triton
import triton.language as tl

torch.manual_seed(0)


@triton.jit
def add_cond_kernel(x_ptr, c_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0)
    c = tl.load(c_ptr + offs)
    tl.store(o_ptr, c)


n = 6291456
grid = (n,)
add_cond_kernel[grid](torch.randn((256, 256, 4096), device='cuda:0'), torch.randn((1048576,), device='cuda:0').as_strided((256, 256, 4096), (4096, 0, 1)), torch.randn((256, 256, 4096), device='cuda:0'), n, BLOCK=0)
torch.cuda.synchronize()
