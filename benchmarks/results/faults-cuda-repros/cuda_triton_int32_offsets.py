"""compute-sanitizer (memcheck):
  Invalid __global__ write of size 4 bytes in scale_logits_kernel
  thread (0,0,0) in block (6711938,0,0): writes 4 B at 0x7febf2148a00
  host: launch < [libc.so.6] < __libc_start_main < __call__ in driver.py:713
  at least 20 errors (memcheck stopped after printing them)
"""

import torch
import triton
import triton.language as tl

torch.manual_seed(0)


@triton.jit
def scale_logits_kernel(x_ptr, out_ptr, n, inv_temperature, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK
    tl.store(out_ptr + offs, 0)


n = 7340032
grid = (n,)
scale_logits_kernel[grid](torch.randn((8, 2048, 151936), device='cuda:0'), torch.randn((8, 2048, 151936), device='cuda:0'), n, 1.0, BLOCK=320)
torch.cuda.synchronize()
