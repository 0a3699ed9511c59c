"""The batch generator fails while the training loop fetches its 4th batch: the failure is in
the loop (its `for` line), in step 3, not after it."""

import torch

table = torch.arange(10)


def batches():
    for start in (0, 2, 4, 9):
        yield table[torch.tensor([start, start + 1])].float()  # 9 + 1 is out of range


torch.manual_seed(0)
layer = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
for batch in batches():
    loss = layer(batch).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
