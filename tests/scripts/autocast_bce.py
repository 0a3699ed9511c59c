"""BCE fed a raw logit above 1 inside an autocast region (CPU bf16 autocast)."""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(6, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    x = torch.randn(8, 6)
    target = torch.randint(0, 2, (8, 1)).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(x)
    probs = torch.sigmoid(hidden.float())
    if step == 3:
        probs = probs + 1.5
    loss = F.binary_cross_entropy(probs, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
