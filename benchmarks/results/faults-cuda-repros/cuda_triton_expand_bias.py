"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 16 bytes in add_cond_kernel
  thread (32,0,0) in block (2953,0,0): reads 16 B at 7.5 MiB after the end of `cond` (arg 1)
  host: launch < [libc.so.6] < __libc_start_main < __call__ in driver.py:713
  at least 20 errors (memcheck stopped after printing them)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

torch.manual_seed(0)


@triton.jit
def add_cond_kernel(x_ptr, c_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x + c, mask=mask)


x = torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0')
n = x.numel()
grid = (triton.cdiv(n, 1024),)
cond = torch.randn((1048576,), dtype=torch.float32, device='cuda:0').as_strided((256, 256, 4096), (4096, 0, 1), 0)
add_cond_kernel[grid](x, cond, torch.randn((256, 256, 4096), dtype=torch.float32, device='cuda:0'), n, BLOCK=1024)
torch.cuda.synchronize()
