"""Retrieval with mined hard negatives inside a checkpointed scoring block (activation
checkpointing, `torch.utils.checkpoint`). The block picks each query's hard negative by id from
an expanded (docs, docs) score grid: no memory in forward. Its backward scatters into a dense
gradient of the whole grid; at step 3 the corpus grows to 200,000 documents and that gradient,
asked for in the backward of the recomputed block, is 149 GiB."""

import argparse

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class HardNegativeScore(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def forward(self, docs: torch.Tensor, mined: torch.Tensor) -> torch.Tensor:
        scores = self.score(docs).squeeze(-1)  # (docs,)
        grid = scores.unsqueeze(0).expand(docs.shape[0], docs.shape[0])
        return grid.gather(1, mined).squeeze(1)  # reprocut: culprit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reentrant", action="store_true", help="use_reentrant=True")
    args = parser.parse_args()
    torch.manual_seed(0)
    encoder = nn.Linear(32, 32).to(args.device)
    head = HardNegativeScore(32).to(args.device)
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
    for step, docs in enumerate([500, 1000, 2000, 200_000]):
        features = encoder(torch.randn(docs, 32, device=args.device))
        mined = torch.randint(0, docs, (docs, 1), device=args.device)
        hardest = checkpoint(head, features, mined, use_reentrant=args.reentrant)
        loss = torch.relu(1.0 - features.sum(-1) + hardest).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: {docs} documents, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
