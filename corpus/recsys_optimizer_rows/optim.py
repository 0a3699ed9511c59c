"""Row-wise Adagrad: one accumulator per embedding row, updating only the rows a batch touched.

The training loop passes the touched rows (the batch's item ids) to `step`, as large-table
recommenders do to skip untouched rows.
"""

from __future__ import annotations

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.05, eps: float = 1e-8) -> None:
        super().__init__(params, {"lr": lr, "eps": eps, "rowwise": False})
        self.rows: torch.Tensor | None = None

    def set_touched_rows(self, rows: torch.Tensor) -> None:
        self.rows = rows.unique()

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not group["rowwise"] or self.rows is None:  # plain Adagrad
                    state.setdefault("dense_sum", torch.zeros_like(p)).addcmul_(p.grad, p.grad)
                    p.addcdiv_(p.grad, state["dense_sum"].sqrt() + group["eps"], value=-group["lr"])
                    continue
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], device=p.device)
                grad = p.grad.index_select(0, self.rows)  # reprocut: culprit
                state["sum"].index_add_(0, self.rows, grad.pow(2).mean(1))
                scale = group["lr"] / (state["sum"][self.rows].sqrt() + group["eps"])
                p.index_add_(0, self.rows, -scale[:, None] * grad)
