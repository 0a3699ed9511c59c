"""Train a small causal language model with QK-norm attention under torch.compile (CUDA).

The norm of queries and keys is `qknorm::rms_scale` (kernels.py): a Triton kernel registered
with `torch.library.triton_op`, defined only when Triton imports. Training follows a sequence
length curriculum: 128 tokens for the first steps, 1024 from step 4 on. Bug: for long
sequences the attention takes the chunked path, which transposes queries and keys to
(batch, heads, tokens, head_dim) *before* normalizing them; the kernel ignores the transposed
layout and reads far past the end of the tensor: an illegal memory access.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import rms_scale

VOCAB, DIM, HEADS, LAYERS = 4096, 1024, 64, 2
HEAD_DIM = DIM // HEADS
CHUNKED_FROM = 256  # sequences longer than this take the chunked attention path


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(DIM, DIM, bias=False)
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.v = nn.Linear(DIM, DIM, bias=False)
        self.q_norm = nn.Parameter(torch.ones(HEAD_DIM))
        self.k_norm = nn.Parameter(torch.ones(HEAD_DIM))
        self.proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = (f(x).view(batch, tokens, HEADS, HEAD_DIM) for f in (self.q, self.k, self.v))
        if tokens > CHUNKED_FROM:  # heads first, so each chunk is a slice along tokens
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            q = rms_scale(q, self.q_norm)  # reprocut: culprit
            k = rms_scale(k, self.k_norm)
        else:
            q = rms_scale(q, self.q_norm).transpose(1, 2)
            k = rms_scale(k, self.k_norm).transpose(1, 2)
            v = v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, DIM))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(DIM)
        self.attn = Attention()
        self.norm2 = nn.RMSNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def curriculum(step: int) -> int:
    """Tokens per sequence: short while the model warms up, then the full context."""
    return 128 if step < 4 else 1024


def batch(step: int, size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, VOCAB, (size, curriculum(step) + 1), generator=g)
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = LanguageModel().to(args.device)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    for step in range(args.steps):
        inputs, targets = batch(step, args.batch, args.device)
        logits = compiled(inputs)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"step {step} tokens {inputs.shape[1]} loss {loss.item():.4f} "
              f"ppl {math.exp(min(loss.item(), 20)):.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
