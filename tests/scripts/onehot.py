"""one_hot with too few classes: no aten op raises on CPU, the public call does."""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
weights = torch.nn.Linear(4, 1)
optimizer = torch.optim.Adam(weights.parameters())
for step in range(6):
    labels = torch.randint(0, 4, (8,))
    if step == 2:
        labels[5] = 4
    encoded = F.one_hot(labels, num_classes=4).float()
    loss = weights(encoded).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
