"""Trains a table whose rows a custom op gathers; the ids grow past the table at step 5."""

import torch
from ops import describe, gather_rows

torch.manual_seed(0)
table = torch.nn.Parameter(torch.randn(16, 4))
optimizer = torch.optim.SGD([table], lr=0.1)
print(describe())
for step in range(8):
    ids = torch.arange(4) + 3 * step  # step 5 reaches rows 15..18
    rows = gather_rows(table.detach(), ids)
    loss = (rows * table[:4]).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, float(loss))
