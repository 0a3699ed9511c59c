"""`grid::cell_features`: each point's feature from its grid cell, looked up by a numpy kernel
when numpy is there (a pure torch fallback otherwise), with a backward for the table."""

try:
    import numpy as np
except ImportError:  # numpy is optional: the torch fallback below
    np = None

import torch

GRID = 4

if np is not None:

    @torch.library.custom_op("grid::cell_features", mutates_args=())
    def cell_features(table: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        rows = table.detach().numpy()[cells.numpy()]  # numpy checks the bounds
        return torch.from_numpy(np.ascontiguousarray(rows))

    @cell_features.register_fake
    def _(table: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        return table.new_empty((cells.shape[0], table.shape[1]))

    def _setup(ctx, inputs, output) -> None:
        table, cells = inputs
        ctx.save_for_backward(cells)
        ctx.rows = table.shape[0]

    def _backward(ctx, grad: torch.Tensor):
        (cells,) = ctx.saved_tensors
        table_grad = grad.new_zeros((ctx.rows, grad.shape[1])).index_add_(0, cells, grad)
        return table_grad, None

    cell_features.register_autograd(_backward, setup_context=_setup)

else:

    def cell_features(table: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        return table[cells]


def cells_of(points: torch.Tensor) -> torch.Tensor:
    """Row-major cell ids of points in [0, 1]^2 on a GRID x GRID grid."""
    xy = (points * GRID).long()
    return xy[:, 1] * GRID + xy[:, 0]
