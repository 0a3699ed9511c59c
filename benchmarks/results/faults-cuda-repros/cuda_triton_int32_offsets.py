"""compute-sanitizer (memcheck):
  Invalid __global__ write of size 16 bytes in scale_logits_kernel
  thread (0,0,0) in block (2098877,0,0): writes 16 B at 8.7 GiB before the start of `logits` (arg 0)
  host: launch < [libc.so.6] < __libc_start_main < __call__ in driver.py:713
  at least 20 errors (memcheck stopped after printing them)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

torch.manual_seed(0)


@triton.jit
def scale_logits_kernel(x_ptr, out_ptr, n, inv_temperature, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * inv_temperature, mask=mask)


logits = torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0')
n = logits.numel()
grid = (triton.cdiv(n, 1024),)
temperature = 2.0
scale_logits_kernel[grid](logits, torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0'), n, 1.0 / temperature, BLOCK=1024)
torch.cuda.synchronize()
