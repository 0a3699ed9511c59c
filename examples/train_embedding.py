"""Train a tiny next-token LSTM language model on a synthetic corpus.

The bug (a real and common one): the tokenizer gains a special token (`<tool>`) after the
model was sized from `len(tokenizer)`, and nobody calls "resize embeddings". Token id 1000 does
not exist in a 1000-row embedding table. Only a few documents contain the new token, so the
first healthy steps train fine and the run dies at step 12.

On CPU:   IndexError: index out of range in self   (at the embedding line)
On CUDA:  CUDA error: device-side assert triggered (reported later, at a different line)

    python examples/train_embedding.py                 # CPU
    python examples/train_embedding.py --device cuda   # the confusing CUDA version
    reprocut record examples/train_embedding.py --device cuda
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Tokenizer:
    """A word-level tokenizer with a fixed base vocabulary plus added special tokens."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab = {f"w{i}": i for i in range(vocab_size)}

    def add_tokens(self, tokens: list[str]) -> None:
        for token in tokens:
            self.vocab.setdefault(token, len(self.vocab))

    def encode(self, text: str) -> list[int]:
        return [self.vocab[word] for word in text.split()]

    def __len__(self) -> int:
        return len(self.vocab)


class SyntheticCorpus(Dataset):
    """Random "documents"; every `tool_every`-th one ends with a tool call marker."""

    def __init__(self, tokenizer: Tokenizer, size: int, seq_len: int, tool_every: int) -> None:
        rng = random.Random(0)
        base = [w for w in tokenizer.vocab if w.startswith("w")]
        self.samples = []
        for i in range(size):
            words = [rng.choice(base) for _ in range(seq_len + 1)]
            if i > 0 and i % tool_every == 0:
                words[-3] = "<tool>"
            self.samples.append(torch.tensor(tokenizer.encode(" ".join(words))))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.samples[index]
        return tokens[:-1], tokens[1:]


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # reprocut: culprit
        x, _ = self.lstm(x)
        return self.head(self.norm(x))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=4)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)

    tokenizer = Tokenizer(vocab_size=1000)
    model = TinyLM(len(tokenizer), dim=64, hidden=128).to(device)
    tokenizer.add_tokens(["<tool>"])  # the bug: the model is not resized after this

    # Sample 100 is the first with the new token: batch 100 // 8 = 12.
    dataset = SyntheticCorpus(tokenizer, size=400, seq_len=args.seq_len, tool_every=100)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()

    model.train()
    start = time.perf_counter()
    for step, (inputs, targets) in enumerate(loader):
        if step >= args.steps:
            break
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs)
        loss = loss_fn(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.log_every == 0:
            elapsed = time.perf_counter() - start
            print(f"step {step:3d}  loss {loss.item():.4f}  {elapsed:.1f}s", flush=True)
    print("done")


if __name__ == "__main__":
    main()
