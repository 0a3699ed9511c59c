"""Minimal reproduction of a failure in aten::nll_loss_forward.

Expected: IndexError in aten::nll_loss_forward: Target <n> is out of bounds.
Message: Target 3 is out of bounds.
Call: torch.nn.functional.cross_entropy
Original: x (32, 3), target (32,)
  target: target max 3 ≥ 3 classes at [0]; 4 of 32 target values outside [0, 3)
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
    target = torch.tensor([3])
    torch.nn.functional.cross_entropy(x, target)


if __name__ == "__main__":
    main()
