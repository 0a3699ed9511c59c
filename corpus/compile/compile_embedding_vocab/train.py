"""A compiled tiny LM whose data pipeline adds a <|sep|> token the model was never resized for.

The id appears from step 3 on; the same lookup fails eagerly (IndexError) and compiled (an
Inductor kernel's `index out of bounds` check): the compiler is not involved.
"""

import argparse

import torch
from torch import nn

VOCAB = 64
SEP = VOCAB  # added to the tokenizer after the model was built


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)  # reprocut: culprit
        return self.head(torch.tanh(self.mix(hidden)))


def batch(step: int, device: str) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (4, 12))
    if step >= 3:  # joined documents now carry the separator
        ids[:, 6] = SEP
    return ids.to(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.compile(TinyLM(VOCAB).to(args.device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        ids = batch(step, args.device)
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1).clamp(max=VOCAB - 1)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
