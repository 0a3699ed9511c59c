"""Minimal reproduction: aten::exp makes inf (it raises nothing: the check at the end does).

Expected: FloatingPointError in aten::exp: non-finite output: inf
Message: non-finite output: inf
Call: torch.Tensor.exp
Original: x (8, 12, 12)
  x: float16 scores max 18.22 at [0, 2, 1]: exp overflows above 11.09
Data: real (values captured from the failing run)
CPU: reproduces too (same signature)
Float64: stays finite: a precision problem (float16 cannot hold the result)

Seen on:
  torch 2.13.0+cpu, CUDA none, driver none
  GPU none, Python 3.11.7, Linux-6.18.44-fc-v1098-x86_64-with-glibc2.36

Run: python repro.py
"""

import torch


def main():
    x = torch.tensor([18.21875], dtype=torch.float16)
    out = x.exp()
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    if any(o.isnan().any() for o in outputs):
        raise FloatingPointError("non-finite output: nan")
    if any(o.isinf().any() for o in outputs):
        raise FloatingPointError("non-finite output: inf")


if __name__ == "__main__":
    main()
