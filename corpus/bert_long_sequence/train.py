"""Fine-tune a small BERT-style document classifier without truncation.

Bug: the collate function pads to the longest document in the batch but never truncates to
`max_position_embeddings` (64). Most documents are short; the first long one (batch 6) produces
position ids up to 79.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Embeddings(nn.Module):
    def __init__(self, vocab: int, dim: int, max_positions: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.word_embeddings(input_ids)
        x = x + self.position_embeddings(positions)  # reprocut: culprit
        return self.norm(x)


class DocClassifier(nn.Module):
    def __init__(self, vocab: int = 3000, dim: int = 64, max_positions: int = 64,
                 num_labels: int = 4) -> None:
        super().__init__()
        self.embeddings = Embeddings(vocab, dim, max_positions)
        layer = nn.TransformerEncoderLayer(dim, 4, 128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.classifier = nn.Linear(dim, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embeddings(input_ids), src_key_padding_mask=attention_mask == 0)
        return self.classifier(h[:, 0])


class Reviews(Dataset):
    def __init__(self, size: int) -> None:
        rng = random.Random(7)
        self.docs = []
        for i in range(size):
            length = 80 if i == 100 else rng.randint(8, 60)
            self.docs.append(([101] + [rng.randint(1000, 2999) for _ in range(length - 1)],
                              rng.randint(0, 3)))

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        return self.docs[i]


def collate(batch: list[tuple[list[int], int]]) -> dict[str, torch.Tensor]:
    longest = max(len(ids) for ids, _ in batch)  # no truncation to max_position_embeddings
    input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, (ids, _) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
    labels = torch.tensor([label for _, label in batch])
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = DocClassifier().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    loader = DataLoader(Reviews(192), batch_size=args.batch_size, collate_fn=collate)
    for epoch in range(args.epochs):
        for step, batch in enumerate(loader):
            batch = {k: v.to(args.device) for k, v in batch.items()}
            logits = model(batch["input_ids"], batch["attention_mask"])
            loss = F.cross_entropy(logits, batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
