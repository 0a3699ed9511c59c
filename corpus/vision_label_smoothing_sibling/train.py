"""Fine-grained bird classification with label smoothing (recipe with sibling modules).

Bug: the label map is built from the CSV's `class_id` column, which starts at 1 for the
"iNat" shard (ids 1..50) while the model and loss use 50 classes 0..49. The first iNat sample
with id 50 arrives at step 5; the smoothed-target scatter_ in losses.py indexes column 50.
"""

from __future__ import annotations

import argparse

import torch
from losses import LabelSmoothingCE
from models.convnet import TinyConvNeXt
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 50


def load_birds(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(31)
    images = torch.randn(n, 3, 32, 32, generator=g)
    cub_labels = torch.randint(0, NUM_CLASSES, (n // 2,), generator=g)
    inat_labels = torch.randint(1, NUM_CLASSES, (n - n // 2,), generator=g)  # 1-based shard
    inat_labels[15] = NUM_CLASSES
    return TensorDataset(images, torch.cat([cub_labels, inat_labels]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--smoothing", type=float, default=0.1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyConvNeXt(NUM_CLASSES).to(args.device)
    criterion = LabelSmoothingCE(NUM_CLASSES, args.smoothing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
    loader = DataLoader(load_birds(160), batch_size=args.batch_size)
    for step, (images, labels) in enumerate(loader):
        images, labels = images.to(args.device), labels.to(args.device)
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step} lr {scheduler.get_last_lr()[0]:.2e} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
