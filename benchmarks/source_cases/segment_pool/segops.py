"""Segment pooling for batches of variable-size graphs: a numpy kernel in an autograd.Function.

The forward sums each node's features into its graph's row (a scatter-add written as a loop,
the way a first CPU version of a custom kernel often is) and divides by the node counts; the
backward hands every node its graph's gradient.
"""

from __future__ import annotations

import numpy as np
import torch


def _segment_sum(values: np.ndarray, segments: np.ndarray, count: int) -> np.ndarray:
    out = np.zeros((count, values.shape[1]), dtype=values.dtype)
    for row in range(values.shape[0]):
        out[segments[row]] += values[row]
    return out


class SegmentMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, segments: torch.Tensor, count: int) -> torch.Tensor:
        ids = segments.detach().cpu().numpy()
        sums = _segment_sum(values.detach().cpu().numpy(), ids, count)
        sizes = np.maximum(np.bincount(ids, minlength=count)[:count], 1)[:, None]
        ctx.save_for_backward(segments)
        ctx.sizes = sizes
        return torch.from_numpy((sums / sizes).astype(sums.dtype)).to(values.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (segments,) = ctx.saved_tensors
        per_graph = (grad.detach().cpu().numpy() / ctx.sizes).astype(np.float32)
        return torch.from_numpy(per_graph[segments.cpu().numpy()]).to(grad.device), None, None


def segment_mean(values: torch.Tensor, segments: torch.Tensor, count: int) -> torch.Tensor:
    return SegmentMean.apply(values, segments, count)
