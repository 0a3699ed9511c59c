"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in gather_rows_kernel
  thread (32,0,0) in block (126,0,0): reads 4 B at 2.0 TiB after the end of `item_table`
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  at least 20 errors (memcheck stopped after printing them)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import cupy
import numpy as np

_SOURCE = r"""
extern "C" __global__ void gather_rows_kernel(const long long* ids, const float* table,
                                              float* out, long long n, int dim) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * dim) return;
    long long row = ids[i / dim];  // unchecked: assumed < rows
    out[i] = table[row * dim + i % dim];
}
"""
_KERNEL = cupy.RawKernel(_SOURCE, "gather_rows_kernel")


def gather_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    ids = ids.contiguous()
    out = torch.empty(ids.numel(), table.shape[1], device=table.device)
    n, dim = ids.numel(), table.shape[1]
    blocks = (n * dim + 255) // 256
    torch.cuda.current_stream().synchronize()
    pointers = (ids.data_ptr(), table.data_ptr(), out.data_ptr(), np.int64(n), np.int32(dim))
    _KERNEL((blocks,), (256,), pointers)
    cupy.cuda.get_current_stream().synchronize()
    return out

ITEMS, DIM, USERS, BATCH, SHELF = 50_000, 64, 1_000, 512, 8
GLOBAL_BASE = 1 << 33


def local_rows(global_ids: torch.Tensor) -> torch.Tensor:
    return global_ids - GLOBAL_BASE


def batch(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    users = torch.randint(0, USERS, (BATCH,), generator=g)
    items = local_rows(GLOBAL_BASE + torch.randint(0, ITEMS, (BATCH,), generator=g))
    if step >= 5:
        arrivals = GLOBAL_BASE + ITEMS + torch.randint(0, 1000, (SHELF,), generator=g)
        items = torch.cat([items[: BATCH - SHELF], arrivals])
    clicks = torch.randint(0, 2, (BATCH,), generator=g).float()
    return users.to(device), items.to(device), clicks.to(device)


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(USERS, DIM)
        self.item_proj = nn.Linear(DIM, DIM)

    def forward(self, users: torch.Tensor, item_vectors: torch.Tensor) -> torch.Tensor:
        return (self.users(users) * self.item_proj(item_vectors)).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    item_table = torch.randn(ITEMS, DIM, device=args.device) * 0.1
    model = TwoTower().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        users, items, clicks = batch(step, args.device)
        with torch.no_grad():
            item_vectors = gather_rows(item_table, items)
        loss = F.binary_cross_entropy_with_logits(model(users, item_vectors), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
torch.cuda.synchronize()
