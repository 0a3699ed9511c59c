"""Segment reductions for a small graph library: per-node means of edge messages."""

import torch


def segment_sum(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    out = values.new_zeros((num_segments, *values.shape[1:]))
    return out.index_add_(0, segment_ids, values)  # reprocut: culprit


def segment_mean(values: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    total = segment_sum(values, segment_ids, num_segments)
    ones = torch.ones(segment_ids.shape[0], dtype=values.dtype, device=values.device)
    count = segment_sum(ones, segment_ids, num_segments).clamp_min(1)
    return total / count.view(-1, *([1] * (values.dim() - 1)))


def edges_to_nodes(edge_index: torch.Tensor, messages: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Mean of incoming messages per destination node."""
    return segment_mean(messages, edge_index[1], num_nodes)
