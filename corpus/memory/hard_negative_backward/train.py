"""Retrieval with mined hard negatives: each query's hard negative is picked by id from a score
grid built as an expanded view (no memory in forward, and gather reads one score per query).
The backward of gather scatters into a dense gradient of the whole grid: at step 4 the corpus
grows to 200,000 documents and that gradient asks for 149 GiB, in backward."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    encoder = nn.Linear(32, 1).to(args.device)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    for step, docs in enumerate([500, 1000, 1500, 2000, 200_000]):
        documents = torch.randn(docs, 32, device=args.device)
        doc_scores = encoder(documents).squeeze(-1)  # (docs,)
        mined = torch.randint(0, docs, (docs, 1), device=args.device)  # a hard negative per query
        grid = doc_scores.unsqueeze(0).expand(docs, docs)  # every query against every document
        hardest = grid.gather(1, mined).squeeze(1)  # reprocut: culprit
        loss = torch.relu(1.0 - doc_scores + hardest).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: {docs} documents, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
