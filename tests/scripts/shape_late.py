"""A feature pipeline that changes width at step 6: a plain shape error inside a Linear."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(9):
    width = 9 if step == 6 else 8
    x = torch.randn(4, width)
    loss = model(x).sum()  # reprocut: culprit
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
