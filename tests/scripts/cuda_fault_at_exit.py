"""Looks up embeddings for ids that run one past the table (CUDA), and ends there.

Nothing after the faulting kernel waits for the GPU (no `.item()`, no print of a tensor, no
other op), so a plain run can end before the kernel even runs: the fault is lost, or the
process dies at teardown with no line to blame.
"""

import torch

table = torch.nn.Embedding(100, 8).cuda()
ids = torch.arange(1, 101, device="cuda").view(4, 25)  # 100 is one past the last row
vectors = table(ids)  # reprocut: culprit
