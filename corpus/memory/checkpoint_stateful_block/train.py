"""Contrastive retrieval whose scoring block schedules its own hard negatives: it counts its
forward calls, samples 4 negatives per query for the first 5 calls, then scores every query
against every document. The block runs under activation checkpointing, which calls forward
again in backward: the recompute of step 2's block is its 6th call and takes the full-grid
branch, a (250000, 250000) float32 matrix (232.83 GiB), although step 2's forward sampled."""

import argparse

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class ScheduledNegatives(nn.Module):
    def __init__(self, dim: int, sampled_calls: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.calls = 0
        self.sampled_calls = sampled_calls

    def forward(self, queries: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # the schedule's clock: every forward call counts, recomputes too
        q = self.proj(queries)
        if self.calls <= self.sampled_calls:
            picked = torch.randint(0, docs.shape[0], (queries.shape[0], 4), device=docs.device)
            return (q.unsqueeze(1) * docs[picked]).sum(-1)
        return q @ docs.T  # reprocut: culprit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    encoder = nn.Linear(16, 16).to(args.device)
    scorer = ScheduledNegatives(16, sampled_calls=5).to(args.device)
    optimizer = torch.optim.SGD([*encoder.parameters(), *scorer.parameters()], lr=0.1)
    for step in range(4):  # each step calls the block twice: forward and its recompute
        queries = encoder(torch.randn(250_000, 16, device=args.device))
        docs = torch.randn(250_000, 16, device=args.device)
        negatives = checkpoint(scorer, queries, docs, use_reentrant=True)
        loss = torch.logsumexp(negatives, dim=-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
