"""Train a clip classifier on packed spectrogram frames (CUDA only).

Each clip has up to MAX_LEN frames of DIM bins; a CUDA C++ extension op (`rowpad::pack_rows`,
built by ext.py) packs the valid frames and marks each clip's end. Bug: from step 5 on, the data
loader cuts long recordings at exactly MAX_LEN frames; the op writes the end marker of a full
clip one row past its slot, and for the batch's last clip one row (16 MiB) past the output, a
512 MiB allocation of its own. At step 5 that row lands in the frames block the allocator keeps
next to the output (silent corruption); at step 6 the two blocks have swapped and the same write
is an illegal memory access in the extension's kernel.
"""

from __future__ import annotations

import argparse

import ext  # noqa: F401  builds and registers rowpad::pack_rows
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, MAX_LEN, DIM, CLASSES = 4, 8, 1 << 22, 10


def clips(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(1, MAX_LEN, (BATCH,), generator=g)
    if step >= 5:  # long recordings are now cut at the limit instead of dropped
        lengths[-1] = MAX_LEN
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    frames = torch.randn(BATCH, MAX_LEN, DIM, device=device)  # 512 MiB: made where it is used
    return frames, lengths.to(device), labels.to(device)


class ClipClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(MAX_LEN, CLASSES)

    def forward(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = torch.ops.rowpad.pack_rows(frames, lengths, MAX_LEN)  # reprocut: culprit
        energy = packed.mean(dim=-1)  # (BATCH, MAX_LEN): small from here on
        return self.head(energy)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ClipClassifier().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        frames, lengths, labels = clips(step, args.device)
        loss = F.cross_entropy(model(frames, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
