"""Train a matrix-factorisation recommender and evaluate recall@10 on held-out users.

Bug: the evaluation set includes cold-start users (ids >= num_users) that never appear in
training. Training only uses embeddings and element-wise products (no matmul), so the first
matrix multiply of the whole run is the scoring matmul in evaluation, right after the bad
lookup. On CUDA the embedding's device-side assert therefore surfaces as a cuBLAS error
(CUBLAS_STATUS_... when calling cublasCreate) at the matmul line: a library error that is
really an earlier index assert. On CPU the lookup raises IndexError directly.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_USERS, NUM_ITEMS, DIM = 1000, 800, 32


class MatrixFactorization(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user_factors = nn.Embedding(NUM_USERS, DIM)
        self.item_factors = nn.Embedding(NUM_ITEMS, DIM)
        self.user_bias = nn.Embedding(NUM_USERS, 1)
        self.item_bias = nn.Embedding(NUM_ITEMS, 1)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        dot = (self.user_factors(users) * self.item_factors(items)).sum(-1)
        return dot + self.user_bias(users).squeeze(-1) + self.item_bias(items).squeeze(-1)


@torch.no_grad()
def recall_at_10(model: MatrixFactorization, users: torch.Tensor, held_out: torch.Tensor) -> float:
    user_vecs = model.user_factors(users)  # reprocut: culprit
    scores = user_vecs @ model.item_factors.weight.T
    top = scores.topk(10, dim=1).indices
    return float((top == held_out[:, None]).any(1).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MatrixFactorization().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    eval_users = torch.randint(0, NUM_USERS, (64,))
    eval_users[40] = NUM_USERS + 5  # a cold-start user
    eval_users = eval_users.to(args.device)
    held_out = torch.randint(0, NUM_ITEMS, (64,), device=args.device)
    for step in range(args.steps):
        users = torch.randint(0, NUM_USERS, (args.batch_size,), device=args.device)
        items = torch.randint(0, NUM_ITEMS, (args.batch_size,), device=args.device)
        clicks = ((users + items) % 3 == 0).float()
        loss = F.binary_cross_entropy_with_logits(model(users, items), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % args.eval_every == 0:
            print(f"step {step} recall@10 {recall_at_10(model, eval_users, held_out):.3f}")
        else:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
