"""A tiny LM whose tokenizer grew: id 1000 reaches a 1000-row embedding at step 7 (CUDA)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)  # reprocut: culprit
        hidden, _ = self.rnn(hidden)
        return self.head(hidden)


torch.manual_seed(0)
model = TinyLM().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(12):
    ids = torch.randint(0, 1000, (8, 32), device="cuda")
    if step == 7:
        ids[2, 3] = 1000  # a token added to the tokenizer after the model was built
    logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.3f}")
