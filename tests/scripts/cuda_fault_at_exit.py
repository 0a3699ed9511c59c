"""Scores a batch with an embedding whose ids run one past the table (CUDA), then ends.

Nothing after the faulting kernel waits for the GPU (no `.item()`, no print of a tensor), so a
plain run can end before the kernel even runs: the fault is lost or dies at teardown.
"""

import torch

table = torch.nn.Embedding(100, 8).cuda()
ids = torch.arange(1, 101, device="cuda").view(4, 25)  # 100 is one past the last row
scores = table(ids).sum(dim=-1)  # reprocut: culprit
ranked = scores.argsort(dim=-1, descending=True)
