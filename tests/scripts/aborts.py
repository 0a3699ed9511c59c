"""Dies hard (SIGABRT) in step 3: the trace must still hold steps 0-2."""

import os

import torch

model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(4, 3)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 2:
        os.abort()
