"""`ragged::mean` as a PyTorch operator: the extension's function (ext.py) wrapped with
torch.library.custom_op, so torch.compile and the dispatcher see it."""

import torch
from ext import _C


@torch.library.custom_op("ragged::mean", mutates_args=())
def ragged_mean(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return _C.ragged_mean(values, offsets)


@ragged_mean.register_fake
def _(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return values.new_empty((offsets.shape[0] - 1, values.shape[1]))


def describe(values: torch.Tensor, offsets: torch.Tensor) -> str:
    return f"{offsets.shape[0] - 1} sequences, {values.shape[0]} tokens"
