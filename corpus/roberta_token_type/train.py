"""Train a RoBERTa-style sentence-pair model with BERT-style feature code.

Bug: RoBERTa has `type_vocab_size=1`, but the shared feature function sets token_type_ids=1 on
the second segment of sentence pairs. The first epochs are single sentences; the pair task
(natural language inference) starts after 8 steps of the multi-task schedule.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class RobertaEmbeddings(nn.Module):
    def __init__(self, vocab: int, dim: int, max_positions: int, type_vocab_size: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim, padding_idx=1)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, dim)
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_type_ids)  # reprocut: culprit
        return self.layer_norm(x)


class RobertaForPairs(nn.Module):
    def __init__(self, vocab: int = 2000, dim: int = 48, num_labels: int = 3) -> None:
        super().__init__()
        self.embeddings = RobertaEmbeddings(vocab, dim, max_positions=66, type_vocab_size=1)
        layer = nn.TransformerEncoderLayer(dim, 4, 96, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_labels)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embeddings(input_ids, token_type_ids))[:, 0])


def bert_features(first: list[int], second: list[int] | None, length: int) -> tuple[list, list]:
    """Shared with the BERT pipeline: segment B gets token type 1."""
    ids = [0, *first, 2]
    types = [0] * len(ids)
    if second is not None:
        ids += [*second, 2]
        types += [1] * (len(second) + 1)
    pad = length - len(ids)
    return ids + [1] * pad, types + [0] * pad


class MultiTask(Dataset):
    def __init__(self, size: int, pair_from: int, length: int = 32) -> None:
        g = torch.Generator().manual_seed(3)
        self.items = []
        for i in range(size):
            first = torch.randint(5, 2000, (10,), generator=g).tolist()
            second = torch.randint(5, 2000, (12,), generator=g).tolist() if i >= pair_from else None
            ids, types = bert_features(first, second, length)
            self.items.append((torch.tensor(ids), torch.tensor(types), i % 3))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = RobertaForPairs().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DataLoader(MultiTask(120, pair_from=64), batch_size=args.batch_size)
    for step, (ids, types, labels) in enumerate(loader):
        ids, types, labels = ids.to(args.device), types.to(args.device), labels.to(args.device)
        loss = F.cross_entropy(model(ids, types), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
