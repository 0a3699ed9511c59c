"""Fine-tune a tiny BERT sentence classifier whose pooling is our own masked-mean kernel."""

import argparse
import os
import sys

import torch
from torch import nn
from transformers import BertConfig, BertModel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from poolext import masked_mean


class Classifier(nn.Module):
    def __init__(self, vocab, width, classes, skip_cls):
        super().__init__()
        config = BertConfig(
            vocab_size=vocab,
            hidden_size=width,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=2 * width,
        )
        self.bert = BertModel(config, add_pooling_layer=False)
        self.head = nn.Linear(width, classes)
        self.skip_cls = skip_cls

    def forward(self, ids, mask):
        hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        if self.skip_cls:
            hidden = hidden[:, 1:]
        pooled = masked_mean(hidden, mask)  # reprocut: culprit
        return self.head(pooled)


def batches(steps, batch_size, length, vocab):
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(1, vocab, (batch_size, length), generator=generator)
        mask = (torch.rand(batch_size, length, generator=generator) > 0.1).long()
        labels = ids[:, 1] % 2
        yield ids, mask, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip-cls-from", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Classifier(vocab=100, width=32, classes=2, skip_cls=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (ids, mask, labels) in enumerate(batches(args.steps, 4, 16, 100)):
        model.skip_cls = step >= args.skip_cls_from
        loss = nn.functional.cross_entropy(model(ids, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
