"""Retrieval with a hardest-negative margin: each query's hardest document is the max over a
score grid built as an expanded view (no memory in forward). The backward of amax compares the
whole grid with the max: at step 4 the corpus grows to 400,000 documents and that comparison
asks for 149 GiB, in backward."""

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
    for step, docs in enumerate([1000, 2000, 4000, 8000, 400_000]):
        documents = torch.randn(docs, 32, device=args.device)
        doc_scores = encoder(documents).squeeze(-1)  # (docs,)
        grid = doc_scores.unsqueeze(0).expand(docs, docs)  # every query against every document
        hardest = grid.amax(dim=1)  # reprocut: culprit
        loss = torch.relu(1.0 - doc_scores + hardest).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: {docs} documents, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
