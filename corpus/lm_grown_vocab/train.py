"""Fine-tune a small chat LM after adding chat special tokens to the tokenizer.

Bug: the model is built from the base vocabulary size *before* `add_special_tokens`, and never
resized; the one conversation with `<|tool|>` (id 512 of a 512-row table) arrives at step 9.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from data import SPECIAL_TOKENS, ChatDataset, ChatTokenizer
from model import MiniGPT
from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    tokenizer = ChatTokenizer(base_vocab=512)
    model = MiniGPT(vocab_size=len(tokenizer)).to(args.device)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)

    loader = DataLoader(ChatDataset(tokenizer, 256, args.seq_len), batch_size=args.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    for epoch in range(args.epochs):
        for batch in loader:
            input_ids = batch["input_ids"].to(args.device)
            labels = batch["labels"].to(args.device)
            logits = model(input_ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}", flush=True)
            step += 1


if __name__ == "__main__":
    main()
