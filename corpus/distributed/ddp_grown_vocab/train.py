"""DDP fine-tune of a small causal LM, each rank reading its own shard of a chat corpus.

Bug: the tokenizer gained a `<|tool|>` token (id 96 = the old vocabulary size) after the model
was built, and the embedding was never resized. Only the tool-use documents contain it, and the
sampler puts all of them in rank 1's shard, the first one in its 6th batch: rank 1 dies at step 5
in the embedding lookup; rank 0 then fails in DDP's gradient all-reduce.

Run: torchrun --nproc-per-node 2 train.py [--device cuda]   (DEVICE=cuda works too)
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

VOCAB = 96  # the tokenizer's size when the model was built
TOOL_TOKEN = VOCAB  # added later for tool calls
SEQ = 12


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mixer = nn.GRU(dim, dim, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # reprocut: culprit
        x, _ = self.mixer(x)
        return self.head(self.norm(x))


class ChatShard(Dataset):
    """Synthetic chat documents; every 20th one (from 41 on) is a tool call with `<|tool|>`."""

    def __init__(self, size: int = 128) -> None:
        g = torch.Generator().manual_seed(7)
        self.docs = []
        for i in range(size):
            doc = torch.randint(0, VOCAB, (SEQ + 1,), generator=g)
            if i >= 41 and i % 20 == 1:
                doc[3] = TOOL_TOKEN
            self.docs.append(doc)

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.docs[i]


def device_for(name: str, local_rank: int) -> torch.device:
    if name.startswith("cuda") and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default=os.environ.get("DEVICE", "cpu"))
    parser.add_argument("--backend", default=os.environ.get("BACKEND", "gloo"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = device_for(args.device, int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = DDP(TinyLM(VOCAB).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = ChatShard()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        batch = batch.to(device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1) % VOCAB)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
