"""Trains a classifier and keeps a calibration histogram with an in-place custom op, all in
one script. Bug: from step 5 the padded rows of a batch get confidence 1.0, and
`int(confidence * buckets)` puts them one bucket past the histogram."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

BUCKETS = 10


@torch.library.custom_op("calib::bucket_add_", mutates_args=("counts",))
def bucket_add_(counts: torch.Tensor, confidence: torch.Tensor) -> None:
    """Adds one to the bucket of each confidence in [0, 1]."""
    buckets = (confidence * counts.shape[0]).long()
    top = int(buckets.max())
    if top >= counts.shape[0]:
        raise IndexError(f"bucket {top} is past the histogram's {counts.shape[0]} buckets")
    counts.index_add_(0, buckets, torch.ones_like(confidence))


@bucket_add_.register_fake
def _(counts: torch.Tensor, confidence: torch.Tensor) -> None:
    return None


def batches(step: int, batch: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch, 8, generator=g)
    y = torch.randint(0, 3, (batch,), generator=g)
    padded = torch.zeros(batch, dtype=torch.bool)
    if step >= 5:  # the loader pads the last batches of an epoch
        padded[-2:] = True
    return x, y, padded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    histogram = torch.zeros(BUCKETS)
    for step in range(args.steps):
        x, y, padded = batches(step)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            confidence = F.softmax(logits, dim=1).max(dim=1).values
            confidence = torch.where(padded, torch.ones_like(confidence), confidence)
            bucket_add_(histogram, confidence)
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
