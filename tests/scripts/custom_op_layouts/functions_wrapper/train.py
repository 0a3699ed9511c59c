"""Sentence embeddings as the mean of ragged token embeddings (`ragged::mean`, ops.py) trained
with a contrastive-style loss. Bug: from step 3 the collator appends a separator token to every
sequence but builds the offsets from the lengths before it: the last offset runs one past."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from ops import describe, ragged_mean


def collate(step: int, sequences: int = 4, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(2, 6, (sequences,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    if step >= 3:  # separators are counted in the offsets, not yet in the tokens
        offsets = offsets + torch.arange(sequences + 1)
    tokens = torch.randint(0, vocab, (int(lengths.sum()),), generator=g)
    return tokens, offsets


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    embed = nn.Embedding(50, 16)
    optimizer = torch.optim.Adam(embed.parameters(), lr=1e-2)
    for step in range(args.steps):
        tokens, offsets = collate(step)
        values = embed(tokens)
        print(describe(values, offsets))
        sentences = ragged_mean(values.detach(), offsets)
        loss = F.mse_loss(sentences, torch.zeros_like(sentences)) + values.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
