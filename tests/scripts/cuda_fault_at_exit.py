"""A Triton add-bias kernel that assumes contiguous rows, fed an expand()ed bias as the very
last thing the script does, behind about a second of queued matrix products (CUDA).

Nothing after the launch waits for the GPU: a plain run may end before the kernel runs, losing
the fault or dying at teardown with no line to blame.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_rows(x_ptr, b_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x + b, mask=mask)


N = 1 << 20
warm = torch.randn(4, N, device="cuda")  # compile and load the kernel on a healthy call first
add_rows[(triton.cdiv(warm.numel(), 1024),)](warm, warm, warm.clone(), warm.numel(), BLOCK=1024)
torch.cuda.synchronize()
x = torch.randn(256, N, device="cuda")
bias = torch.randn(1, N, device="cuda").expand(256, N)  # a broadcast view: storage is N
out = torch.empty_like(x)
a = torch.randn(8192, 8192, device="cuda")
for _ in range(100):  # seconds of queued GPU work: the script's end comes long before the fault
    a = torch.tanh(a @ a)
add_rows[(triton.cdiv(x.numel(), 1024),)](x, bias, out, x.numel(), BLOCK=1024)  # reprocut: culprit
