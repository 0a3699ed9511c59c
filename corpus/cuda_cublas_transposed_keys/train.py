"""Train a query encoder against a memory bank of document keys, scored by a cuBLAS GEMM (CUDA).

Bug: from step 4 the bank is refreshed by `refresh_bank`, which keeps it feature-major (D, N)
for a cheaper momentum update and hands out `bank.t()`: a view with strides (1, N). The cuBLAS
wrapper passes keys.stride(0) = 1 as the leading dimension (it must be >= D), and cuBLAS rejects
the call with CUBLAS_STATUS_INVALID_VALUE: a genuine, synchronous library status error.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from blas import scores

DIM, DOCS, BATCH, VOCAB = 64, 512, 32, 1000


class QueryEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM)
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.proj(self.embed(tokens)), dim=-1)


def refresh_bank(bank: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """Momentum update, feature-major: returns the (N, D) keys as a transposed view."""
    feature_major = 0.9 * bank.t().contiguous() + 0.1 * fresh.t()
    return feature_major.t()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()

    torch.manual_seed(0)
    encoder = QueryEncoder().to(args.device)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    bank = F.normalize(torch.randn(DOCS, DIM, device=args.device), dim=-1)
    for step in range(args.steps):
        if step >= 4:
            bank = refresh_bank(
                bank, F.normalize(torch.randn(DOCS, DIM, device=args.device), dim=-1)
            )
        tokens = torch.randint(0, VOCAB, (BATCH, 12), device=args.device)
        positives = torch.randint(0, DOCS, (BATCH,), device=args.device)
        queries = encoder(tokens)
        with torch.no_grad():
            logits = scores(queries.detach(), bank)
        # the GEMM only ranks the bank; the loss goes through a differentiable copy of it
        loss = F.cross_entropy(queries @ bank.T + 0.0 * logits, positives)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
