"""A DDP job whose rank 1 dies of a segfault in its sixth step (a native extension reading
address 0, say), the same way every run: no Python error, so the rank reports nothing of its
own. Rank 0 then fails in DDP's all-reduce. Each step's loss is printed by every rank."""

import ctypes

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    loss = model(torch.randn(4, 8)).square().mean()
    if rank == 1 and step == 5:
        ctypes.string_at(0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
