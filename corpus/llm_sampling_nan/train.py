"""Train a character-level GRU language model and sample from it every few steps.

Bug: the sampling temperature is annealed linearly to 0 ("greedy at the end") and used as a
divisor. At the evaluation of step 8 the temperature hits 0.0, logits / 0 gives inf and NaN,
softmax gives NaN, and torch.multinomial rejects the distribution. Evaluation runs under
torch.no_grad().
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 48


class CharGRU(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None):
        y, h = self.gru(self.embed(x), h)
        return self.out(y), h


@torch.no_grad()
def sample(model: CharGRU, prompt: torch.Tensor, length: int, temperature: float) -> torch.Tensor:
    model.eval()
    tokens, h = prompt, None
    out = []
    for _ in range(length):
        logits, h = model(tokens, h)
        probs = F.softmax(logits[:, -1] / temperature, dim=-1)  # reprocut: nan origin
        tokens = torch.multinomial(probs, num_samples=1)  # reprocut: culprit
        out.append(tokens)
    model.train()
    return torch.cat(out, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sample-every", type=int, default=4)
    parser.add_argument("--start-temperature", type=float, default=1.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    text = torch.randint(0, VOCAB, (64, 33))
    model = CharGRU().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        batch = text[(step * 8) % 64 : (step * 8) % 64 + 8].to(args.device)
        logits, _ = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if (step + 1) % args.sample_every == 0:
            temperature = args.start_temperature * (1 - (step + 1) / args.sample_every / 2)
            prompt = batch[:2, :4]
            chars = sample(model, prompt, length=16, temperature=temperature)
            print(f"  sample @ T={temperature:.2f}: {chars[0].tolist()}", flush=True)


if __name__ == "__main__":
    main()
