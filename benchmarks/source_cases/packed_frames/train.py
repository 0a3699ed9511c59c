"""Train a small frame classifier on packed MFCC features.

Utterances are packed into one flat feature buffer per batch and sliced back per utterance for
a vectorised normalisation kernel. Bug: utterance lengths are usually multiples of 4 frames, so
every slice starts 16-byte aligned; the first 50-frame utterance (step 4) shifts the next
slice's start by 50 * 13 floats, and the vector loads hit a misaligned address.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import cmvn

N_MFCC, CLASSES = 13, 8


def packed_batch(step: int):
    g = torch.Generator().manual_seed(step)
    lengths = [40, 48, 44, 52]
    if step == 4:
        lengths = [40, 50, 44, 52]
    feats = torch.randn(sum(lengths) * N_MFCC, generator=g)
    labels = torch.randint(0, CLASSES, (sum(lengths),), generator=g)
    return feats, lengths, labels


class FrameClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_MFCC, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.net(frames)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = FrameClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        feats, lengths, labels = packed_batch(step)
        normed, start = [], 0
        with torch.no_grad():
            for n in lengths:
                utterance = feats[start * N_MFCC : (start + n) * N_MFCC]
                normed.append(cmvn(utterance).view(n, N_MFCC))
                start += n
        loss = F.cross_entropy(model(torch.cat(normed)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
