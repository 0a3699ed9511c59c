"""Losses shared by the fine-grained classification recipes."""

from __future__ import annotations

import torch
import torch.nn as nn


class LabelSmoothingCE(nn.Module):
    """Cross entropy against a smoothed one-hot target built with scatter_."""

    def __init__(self, num_classes: int, smoothing: float = 0.1) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.smoothing = smoothing

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        off = self.smoothing / (self.num_classes - 1)
        dist = torch.full_like(logits, off)
        dist.scatter_(1, target.unsqueeze(1), 1.0 - self.smoothing)  # reprocut: culprit
        return torch.sum(-dist * logits.log_softmax(dim=1), dim=1).mean()
