"""A masked mean-pooling "kernel": a numpy stand-in for a compiled CUDA extension.

Like the real kernel it reads its input as one flat, contiguous buffer from the tensor's data
pointer and never looks at strides, and takes the sequence length from the mask: hidden states
cut shorter than their mask (the [CLS] position dropped from one, not the other) make it read
past the end of the buffer, on a GPU an illegal memory access, here an error.
"""

import numpy as np
import torch


def masked_mean(hidden, mask):
    batch, length = mask.shape
    width = hidden.shape[-1]
    n = batch * length * width
    storage = torch.empty(0, dtype=hidden.dtype).set_(hidden.detach().untyped_storage())
    flat = storage[hidden.storage_offset() :].numpy()
    if flat.size < n:
        raise RuntimeError(
            f"masked_mean: illegal memory access (read {n} elements from a buffer of {flat.size})"
        )
    values = flat[:n].reshape(batch, length, width)
    weights = mask.detach().numpy().astype(values.dtype)[:, :, None]
    pooled = (values * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
    return torch.from_numpy(pooled)
