"""DDP training of an intent classifier on utterance features, data sharded over the ranks.

Bug: the label map was built from the first data file only (10 intents, model has 10 outputs);
a later file adds the intent "cancel_subscription", which maps to label 10. The sampler gives
those utterances to rank 0 only, the first in its 5th batch: rank 0 fails at step 4 in the
cross-entropy loss; rank 1 then fails in DDP's gradient all-reduce (or is stopped by torchrun).

Run: torchrun --nproc-per-node 2 train.py [--device cuda]   (DEVICE=cuda works too)
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

INTENTS = ["greet", "bye", "order", "refund", "track", "help", "price", "stock", "login", "other"]
FEATURES = 24


class IntentNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(FEATURES, 48), nn.GELU(), nn.Dropout(0.1), nn.Linear(48, 48), nn.GELU()
        )
        self.classifier = nn.Linear(48, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encoder(x))


def load_utterances(label_map: dict[str, int]) -> TensorDataset:
    """Two synthetic data files; the second one brings an intent the label map never saw."""
    g = torch.Generator().manual_seed(3)
    labels = []
    for i in range(96):
        second_file = i >= 40
        name = "cancel_subscription" if second_file and i % 22 == 14 else INTENTS[(i * 3) % 10]
        labels.append(label_map.setdefault(name, len(label_map)))
    return TensorDataset(torch.randn(96, FEATURES, generator=g), torch.tensor(labels))


def device_for(name: str, local_rank: int) -> torch.device:
    if name.startswith("cuda") and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default=os.environ.get("DEVICE", "cpu"))
    parser.add_argument("--backend", default=os.environ.get("BACKEND", "gloo"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=6)
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = device_for(args.device, int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    label_map = {name: i for i, name in enumerate(INTENTS)}
    model = DDP(IntentNet(num_classes=len(label_map)).to(device))
    dataset = load_utterances(label_map)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for features, labels in loader:
            features, labels = features.to(device), labels.to(device)
            loss = criterion(model(features), labels)  # reprocut: culprit
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
