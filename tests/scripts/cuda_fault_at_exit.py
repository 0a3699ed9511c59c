"""A Triton add-bias kernel that assumes contiguous rows, fed an expand()ed bias as the very
last thing the script does, behind a few seconds of queued matrix products (CUDA).

Nothing after the launch waits for the GPU, and the GPU is still busy when Python reaches the
end: a plain run ends before the kernel even runs, and the fault is lost or dies at teardown
with no line to blame.
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


a = torch.randn(8192, 8192, device="cuda")
for _ in range(40):  # seconds of queued GPU work: the script's end comes long before the fault
    a = torch.tanh(a @ a)
N = 1 << 20
x = torch.randn(256, N, device="cuda")
bias = torch.randn(1, N, device="cuda").expand(256, N)  # a broadcast view: storage is N
out = torch.empty_like(x)
add_rows[(triton.cdiv(x.numel(), 1024),)](x, bias, out, x.numel(), BLOCK=1024)  # reprocut: culprit
