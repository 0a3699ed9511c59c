"""Cross-entropy with a label == num_classes at step 4: the error surfaces in backward (CUDA)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    x = torch.randn(16, 32, device="cuda")
    y = torch.randint(0, 10, (16,), device="cuda")
    if step == 4:
        y[5] = 10
    loss = F.cross_entropy(model(x), y)  # reprocut: culprit
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done", loss.item())
