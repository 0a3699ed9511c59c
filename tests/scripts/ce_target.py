"""A classifier whose label set grows: class 10 appears at step 5 in a 10-class model."""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    x = torch.randn(16, 8)
    y = torch.randint(0, 10, (16,))
    if step == 5:
        y[3] = 10  # a new label the head was never sized for
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("finished")
