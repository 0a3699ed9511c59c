"""A 100-row positional table fed sequences of 60, 80 and then 120 tokens: ids up to 119."""

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_LEN = 100


class Encoder(nn.Module):
    def __init__(self, vocab: int = 500, dim: int = 256) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(MAX_LEN, dim)
        self.out = nn.Linear(dim, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.out((self.tok(ids) + self.pos(positions)).mean(1))


torch.manual_seed(0)
model = Encoder()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for length in (60, 80, 120):
    ids = torch.randint(0, 500, (4, length))
    loss = F.cross_entropy(model(ids), torch.zeros(4, dtype=torch.long))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
