"""A Triton add-bias kernel that assumes contiguous rows, fed an expand()ed bias at step 2."""

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


def fused_bias(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    add_rows[(triton.cdiv(n, 1024),)](x, bias, out, n, BLOCK=1024)  # reprocut: culprit
    return out


torch.manual_seed(0)
N = 1 << 20
layer = torch.nn.Linear(8, 8).cuda()
optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
for step in range(4):
    rows = 4 if step < 2 else 256  # the evaluation batch is larger
    x = torch.randn(rows, N, device="cuda")
    if step < 2:
        bias = torch.randn(rows, N, device="cuda")
    else:
        bias = torch.randn(1, N, device="cuda").expand(rows, N)  # a broadcast view: storage is N
    y = fused_bias(x, bias)
    loss = layer(torch.randn(4, 8, device="cuda")).sum() + (y * 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
