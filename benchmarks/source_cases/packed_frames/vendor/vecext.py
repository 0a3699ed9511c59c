"""A float4-vectorised normalisation "kernel": a numpy stand-in for a compiled CUDA extension.

Like the real kernel it loads four floats at a time straight from the tensor's memory, so the
tensor must start on a 16-byte boundary, and it never checks: on a GPU a start off that boundary
is a "misaligned address" fault; here the stand-in raises the same words.
"""

import numpy as np
import torch

VECTOR = 4  # floats per load: 16 bytes


def cmvn_vec4(x, mean, inv_std):
    if x.storage_offset() % VECTOR:
        raise RuntimeError("cmvn_vec4: misaligned address")
    storage = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
    flat = storage[x.storage_offset() : x.storage_offset() + x.numel()].numpy()
    out = ((flat - np.float32(mean)) * np.float32(inv_std)).astype(np.float32)
    return torch.from_numpy(out).view(x.shape)
