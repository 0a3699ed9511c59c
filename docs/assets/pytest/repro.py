"""Minimal reproduction of a failure in aten::index_add_.

Expected: RuntimeError in aten::index_add_: index <n> is out of bounds for dimension <n> with size <n>
Message: index 5 is out of bounds for dimension 0 with size 5
Call: torch.Tensor.index_add_
Data: mixed: captured values where they matter, generated elsewhere
CPU: reproduces too (same signature)

Seen on:
  torch 2.13.0+cpu, CUDA none, driver none
  GPU none, Python 3.11.7, Linux-6.18.44-fc-v1045-x86_64-with-glibc2.36

Run: python repro.py
"""

import torch


def main():
    x = torch.zeros(1, 1)
    index = torch.tensor([5])
    source = torch.zeros(1, 1)
    x.index_add_(0, index, source)


if __name__ == "__main__":
    main()
