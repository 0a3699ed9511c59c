"""Tokenizer and dataset for the toy chat-LM fine-tune."""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset

CHAT_TOKENS = ["<|user|>", "<|assistant|>"]  # part of the base vocabulary
SPECIAL_TOKENS = ["<|tool|>"]  # added for the tool-use fine-tune


class ChatTokenizer:
    def __init__(self, base_vocab: int) -> None:
        self.vocab = {f"tok{i}": i for i in range(base_vocab - len(CHAT_TOKENS))}
        for token in CHAT_TOKENS:
            self.vocab[token] = len(self.vocab)

    def add_special_tokens(self, tokens: list[str]) -> int:
        added = 0
        for token in tokens:
            if token not in self.vocab:
                self.vocab[token] = len(self.vocab)
                added += 1
        return added

    def encode(self, words: list[str]) -> list[int]:
        return [self.vocab[w] for w in words]

    def __len__(self) -> int:
        return len(self.vocab)


class ChatDataset(Dataset):
    """Synthetic conversations; a few use the tool-call marker, most do not."""

    def __init__(self, tokenizer: ChatTokenizer, size: int, seq_len: int) -> None:
        rng = random.Random(1234)
        words = [w for w in tokenizer.vocab if w.startswith("tok")]
        self.rows = []
        for i in range(size):
            conv = ["<|user|>"] + [rng.choice(words) for _ in range(seq_len // 2 - 1)]
            conv += ["<|assistant|>"] + [rng.choice(words) for _ in range(seq_len - len(conv))]
            if i == 149:  # the only conversation with a tool call
                conv[seq_len // 2 + 2] = "<|tool|>"
            self.rows.append(torch.tensor(tokenizer.encode(conv[: seq_len + 1] + ["tok0"])))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i][:-1], "labels": self.rows[i][1:]}
