"""Train a click-through model on hashed categorical features pooled by a CuPy kernel (CUDA only).

Features are raw 64-bit hashes; `featurize` reduces them modulo the hashed table's rows. Bug:
the "campaign" feature, added to the batches from step 6 on, is appended after that reduction,
so its raw hashes (up to 2**40) reach the kernel as row ids and it reads terabytes past the
table: an illegal memory access at the launch.

compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in hashed_bag
  thread (0,0,0) in block (8,0,0): reads 4 B at 59.6 TiB after the end of `args[1]`
  host: main in repro.py:95
  6404 error(s) in all
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
"""A hashed embedding-bag written as a CuPy RawKernel: mean of `bag` table rows per example.

The kernel trusts its ids: it never checks `0 <= id < rows`. The data pipeline is supposed to
reduce every raw feature hash modulo the table size before it gets here.
"""

import cupy
import numpy as np
import torch

_SOURCE = r"""
extern "C" __global__ void hashed_bag(const long long* __restrict__ ids,
                                      const float* __restrict__ table,
                                      float* __restrict__ out,
                                      int n_bags, int dim, int bag) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // one thread per (bag, feature dim)
    if (i >= n_bags * dim) return;
    int b = i / dim, d = i % dim;
    float total = 0.0f;
    for (int j = 0; j < bag; ++j) {
        long long row = ids[(long long)b * bag + j];  // unchecked: assumed < rows
        total += table[row * dim + d];
    }
    out[i] = total / bag;
}
"""
_KERNEL = cupy.RawKernel(_SOURCE, "hashed_bag")


def hashed_bag(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """ids: (examples, bag) int64 rows of `table` (rows, dim) float32 -> (examples, dim) means."""
    n_bags, bag = ids.shape
    dim = torch.randn((65536, 32), dtype=torch.float32, device='cuda:0').shape[1]
    out = torch.empty(n_bags, dim, device=torch.randn((65536, 32), dtype=torch.float32, device='cuda:0').device, dtype=torch.float32)
    threads = 128
    blocks = (n_bags * dim + threads - 1) // threads
    torch.cuda.current_stream().synchronize()
    args = (cupy.asarray(ids.contiguous()), cupy.asarray(torch.randn((65536, 32), dtype=torch.float32, device='cuda:0')), cupy.asarray(out),
            np.int32(n_bags), np.int32(dim), np.int32(bag))
    _KERNEL((blocks,), (threads,), args)
    cupy.cuda.get_current_stream().synchronize()
    return out

ROWS, DIM, BATCH, FIELDS = 1 << 16, 32, 256, 6


def featurize(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    raw = torch.randint(0, 1 << 40, (BATCH, FIELDS), generator=g)
    ids = raw % ROWS
    if step >= 6:
        campaign = torch.randint(0, 1 << 40, (BATCH, 1), generator=g)
        ids = torch.cat([ids, campaign], dim=1)
    clicks = torch.randint(0, 2, (BATCH,), generator=g).float()
    return ids.to(device), clicks.to(device)


class ClickModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.mlp(pooled).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=9)
    args = parser.parse_args()

    torch.manual_seed(0)
    table = torch.randn(ROWS, DIM, device=args.device) * 0.05
    model = ClickModel().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        ids, clicks = featurize(step, args.device)
        with torch.no_grad():
            pooled = hashed_bag(ids, table)
        loss = F.binary_cross_entropy_with_logits(model(pooled), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
torch.cuda.synchronize()
