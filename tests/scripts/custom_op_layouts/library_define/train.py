"""A bag-of-tokens language classifier over packed rows (`tok::pack`, tokens.py). Bug: from
step 3 the tokenizer adds a begin and an end token, and the longest sequences no longer fit
the packed width."""

import argparse

import tokens  # noqa: F401  registers tok::pack
import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH = 8


def sentences(step: int, count: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(3, WIDTH + 1, (count,), generator=g)
    if step >= 3:  # <bos> and <eos> are now part of every sequence
        lengths = lengths + 2
    ids = torch.randint(1, 100, (int(lengths.sum()),), generator=g)
    return ids, lengths, torch.randint(0, 2, (count,), generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    embed = nn.EmbeddingBag(100, 16, mode="mean", padding_idx=0)
    head = nn.Linear(16, 2)
    optimizer = torch.optim.Adam([*embed.parameters(), *head.parameters()], lr=1e-2)
    for step in range(args.steps):
        ids, lengths, labels = sentences(step)
        rows = torch.ops.tok.pack(ids, lengths, WIDTH)
        loss = F.cross_entropy(head(embed(rows)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
