"""A torchrun job that hangs: rank 1 stalls (a stuck data loader, say) before the next
collective, so rank 0 waits in all_reduce for gloo's 30-minute timeout. Each rank first writes
what it was launched with (sys.argv, sys.path[0], __name__, -u) to seen-<rank>.json in the
working directory."""

import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
seen = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "name": __name__,
    "unbuffered": sys.stdout.write_through,  # python -u
}
with open(f"seen-{dist.get_rank()}.json", "w") as out:
    json.dump(seen, out)
total = torch.ones(4)
for step in range(3):
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} step {step}", flush=True)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(total)
