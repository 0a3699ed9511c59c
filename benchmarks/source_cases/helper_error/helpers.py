"""Data utilities shared by the training scripts."""

import torch

PAD = 0


def make_vocab(words):
    return {word: index + 1 for index, word in enumerate(sorted(set(words)))}


def encode(sentence, vocab):
    return [vocab.get(word, PAD) for word in sentence.split()]


def pad_batch(rows, width):
    """Pad token rows to `width`: the attention kernel we ship needs a fixed width."""
    padded = []
    for row in rows:
        if len(row) > width:
            raise ValueError(f"sequence of {len(row)} tokens does not fit width {width}")
        padded.append(row + [PAD] * (width - len(row)))
    return torch.tensor(padded)


def warmup_lr(step, base, warmup):
    return base * min(1.0, (step + 1) / warmup)
