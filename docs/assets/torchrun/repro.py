"""Minimal reproduction of a failure in aten::embedding.

Expected: IndexError in aten::embedding: index out of range in self
Message: index out of range in self
Call: torch.nn.functional.embedding
Original: ids (4, 12), weight (96, 32)
  ids: index max 96 ≥ 96 rows at [0, 3]; 1 of 48 index values outside [0, 96)
Data: mixed: captured values where they matter, generated elsewhere
CPU: reproduces too (same signature)

Seen on:
  torch 2.13.0+cpu, CUDA none, driver none
  GPU none, Python 3.11.7, Linux-6.18.44-fc-v1098-x86_64-with-glibc2.36

Run: python repro.py
"""

import torch


def main():
    ids = torch.tensor([96])
    weight = torch.zeros(1, 1)
    torch.nn.functional.embedding(ids, weight)


if __name__ == "__main__":
    main()
