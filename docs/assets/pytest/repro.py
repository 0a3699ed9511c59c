"""Minimal reproduction of a failure in aten::index_add_.

Expected: RuntimeError in aten::index_add_: index <n> is out of bounds for dimension <n> with size <n>
Message: index 5 is out of bounds for dimension 0 with size 1
Original's message (the unshrunk program): index 5 is out of bounds for dimension 0 with size 5
Call: torch.Tensor.index_add_
Original: x (5, 4), index (6,), source (6, 4)
  index: index max 5 ≥ 5 (size of dim 0) at [5]; 1 of 6 index values outside [0, 5)
Data: mixed: captured values where they matter, generated elsewhere
CPU: reproduces too (same signature)

Seen on:
  torch 2.13.0+cpu, CUDA none, driver none
  GPU none, Python 3.11.7, Linux-6.18.44-fc-v1098-x86_64-with-glibc2.36

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
