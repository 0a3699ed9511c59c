"""One counter spans the epochs: `while step < total_steps` with `step += 1` at the body's end.

The lookup goes out of range when the user's step is 7, after 7 optimizer steps.
"""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
step, total_steps = 0, 20
while step < total_steps:
    ids = torch.tensor([step % 10, 12 if step == 7 else 1])
    loss = model(ids).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
