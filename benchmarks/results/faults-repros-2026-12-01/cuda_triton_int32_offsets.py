
"""compute-sanitizer (memcheck):
  Invalid __global__ write of size 16 bytes in scale_logits_kernel
  thread (32,0,0) in block (2097232,0,0): writes 16 B at 13.3 GiB before the start of `out`
  host: launch < [libc.so.6] < __libc_start_main < __call__ in driver.py:713
  63556 error(s) in all
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
"""A fused "temperature scale" Triton kernel over the flattened logits buffer.

Offsets are computed as `pid * BLOCK + arange`, all int32: past 2**31 elements they wrap to
negative numbers, the `offs < n` mask lets them through, and the loads land gigabytes before the
buffer. (The fix: `pid.to(tl.int64) * BLOCK`.)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_logits_kernel(x_ptr, out_ptr, n, inv_temperature, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * inv_temperature, mask=mask)


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    out = torch.empty_like(torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0'))
    n = torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0').numel()
    grid = (triton.cdiv(n, 1024),)
    scale_logits_kernel[grid](torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0'), torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0'), n, 1.0 / temperature, BLOCK=1024)
    return torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0')

VOCAB, HIDDEN, BATCH = 151_936, 64, 8


def context_length(step: int) -> int:
    return 256 if step < 3 else 2048


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    head = Head().to(args.device, torch.bfloat16)
    optimizer = torch.optim.SGD(head.parameters(), lr=1e-3)
    for step in range(args.steps):
        tokens = context_length(step)
        hidden = torch.randn(BATCH, tokens, HIDDEN, device=args.device, dtype=torch.bfloat16)
        targets = torch.randint(0, VOCAB, (BATCH, tokens), device=args.device)
        with torch.no_grad():
            teacher = scale_logits(head(hidden), temperature=2.0)
        logits = head(hidden[:, :16])
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets[:, :16].flatten())
        loss = loss + 0.0 * teacher[:, :1].float().mean()
        del teacher
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} tokens {tokens} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
torch.cuda.synchronize()
