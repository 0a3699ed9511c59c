from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import cupy
import numpy as np
torch.manual_seed(0)

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


class TwoTower(nn.Module):
    pass
ids = torch.randint(22, 8589985559, (512,), dtype=torch.int64, device='cuda:0')
ids = ids.contiguous()
table = torch.randn((50000, 64), dtype=torch.float32, device='cuda:0')
out = torch.empty(ids.numel(), table.shape[1], device=table.device)
n, dim = ids.numel(), table.shape[1]
blocks = (n * dim + 255) // 256
torch.cuda.current_stream().synchronize()
pointers = (ids.data_ptr(), table.data_ptr(), out.data_ptr(), np.int64(n), np.int32(dim))
_KERNEL((blocks,), (256,), pointers)
