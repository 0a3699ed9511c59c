"""A torch.compile'd model: reprocut runs it eagerly to see its ops, and says so."""

import torch


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.out = torch.nn.Linear(8, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


torch.manual_seed(0)
model = torch.compile(Tagger())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    ids = torch.randint(0, 20, (2, 6))
    if step == 2:
        ids[1, 1] = 20
    loss = model(ids).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
