"""Train a bag-of-words classifier on a synthetic corpus."""

import argparse
import random

import torch
from helpers import encode, make_vocab, pad_batch, warmup_lr
from torch import nn

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


class Classifier(nn.Module):
    def __init__(self, vocab_size, dim, classes):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        hidden = self.embed(tokens).mean(dim=1)
        return self.head(hidden)


def make_corpus(n, seed):
    rng = random.Random(seed)
    sentences = []
    for i in range(n):
        length = 3 + i % 5 + (12 if i == 37 else 0)  # one long review in the data
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(length)))
    return sentences


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    sentences = make_corpus(64, seed=1)
    vocab = make_vocab(word for sentence in sentences for word in sentence.split())
    model = Classifier(len(vocab) + 1, 32, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        for start in range(0, len(sentences), args.batch_size):
            rows = [encode(s, vocab) for s in sentences[start : start + args.batch_size]]
            tokens = pad_batch(rows, width=12)
            labels = torch.tensor([len(row) % 4 for row in rows])
            for group in optimizer.param_groups:
                group["lr"] = warmup_lr(step, 0.1, 10)
            loss = loss_fn(model(tokens), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
    print("done")


if __name__ == "__main__":
    main()
