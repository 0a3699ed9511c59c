"""A tiny LM trained for 30 steps, then asked to generate past its 16 positions: the failure
comes after the training loop, in generate(), in no training step (`cuda` as the argument: on
the GPU, where the position lookup device-asserts)."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 50, block: int = 16, dim: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.tok(ids) + self.pos(positions))


@torch.no_grad()
def generate(model: TinyLM, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    for _ in range(new_tokens):
        following = model(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, following], dim=1)
    return ids


def main(device: str) -> None:
    torch.manual_seed(0)
    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, 50, (8, 16), device=device)
    for _iteration in range(30):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 50), data[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(generate(model, data[:1, :4], 20))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
