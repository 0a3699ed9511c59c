"""A torchrun job that hangs: rank 1 stalls (a stuck data loader, say) before the next
collective, so rank 0 waits in all_reduce for gloo's 30-minute timeout."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(4)
for step in range(3):
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} step {step}", flush=True)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(total)
