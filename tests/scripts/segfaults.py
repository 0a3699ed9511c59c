"""Dies of a segfault (reads address 0) in its third iteration, the same way every run."""

import ctypes

import torch

model = torch.nn.Linear(3, 1)
for step in range(5):
    model(torch.randn(4, 3)).sum().backward()
    if step == 2:
        ctypes.string_at(0)
