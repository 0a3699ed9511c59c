"""A custom operator registered with torch.library: rows of a table by id, unchecked upstream."""

import torch

UNUSED_SCALE = 3.0  # nothing the op needs: the repro leaves it out


@torch.library.custom_op("demo::gather_rows", mutates_args=())
def gather_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    top = int(ids.max())
    if top >= table.shape[0]:
        raise IndexError(f"row id {top} is past the table's {table.shape[0]} rows")
    return table[ids].clone()


@gather_rows.register_fake
def _(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return table.new_empty((ids.shape[0], table.shape[1]))


def describe() -> str:
    return f"gather_rows x{UNUSED_SCALE}"
