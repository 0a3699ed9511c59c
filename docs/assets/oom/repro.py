"""Minimal reproduction of a failure in aten::sub.

Expected: RuntimeError in aten::sub: out of memory
Message: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 250000000000 bytes. Error code 12 (Cannot allocate memory)
Call: torch.Tensor.sub
Why: (250000, 1) - (250000,) broadcasts to (250000, 250000) float32: 232.83 GiB
Data: none needed (torch.empty of the recorded shapes, strides and dtypes)
CPU: reproduces too (same signature)

Seen on:
  torch 2.13.0+cpu, CUDA none, driver none
  GPU none, Python 3.11.7, Linux-6.18.44-fc-v1098-x86_64-with-glibc2.36

Run: python repro.py
"""

import torch


def main():
    x = torch.empty((250000, 1), requires_grad=True)
    other = torch.empty((250000,))
    x.sub(other)


if __name__ == "__main__":
    main()
