"""A memory-saving neighbour gather for point clouds (custom autograd Function).

Forward uses advanced indexing, which wraps -1 to the last point; backward scatters gradients
with index_add_, which does not. The mismatch only shows in backward.
"""

from __future__ import annotations

import torch


class GatherNeighbours(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feats: torch.Tensor, knn: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(knn)
        ctx.num_points = feats.shape[0]
        return feats[knn]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (knn,) = ctx.saved_tensors
        grad_feats = grad.new_zeros(ctx.num_points, grad.shape[-1])
        grad_feats.index_add_(0, knn.flatten(), grad.reshape(-1, grad.shape[-1]))  # reprocut: culprit
        return grad_feats, None


def gather_neighbours(feats: torch.Tensor, knn: torch.Tensor) -> torch.Tensor:
    return GatherNeighbours.apply(feats, knn)
