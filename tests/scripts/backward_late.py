"""A custom autograd Function that scales its gradient by per-row weights it never uses
forward; at step 6 the weights have one row too many: a plain shape error inside backward, in
no op that can device-assert."""

import torch


class RowScaledGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights):
        ctx.save_for_backward(weights)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        (weights,) = ctx.saved_tensors
        return grad * weights[:, None], None  # reprocut: culprit


torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(9):
    weights = torch.ones(3 if step == 6 else 2)
    loss = RowScaledGrad.apply(model(torch.randn(2, 4)), weights).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
