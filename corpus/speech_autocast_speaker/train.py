"""Train a speaker-conditioned keyword-spotting model with mixed precision (autocast).

Bug: the speaker table is sized from the training manifest's speaker count (40); the manifest
was later extended with new speakers and speaker ids are assigned in file order, so the first
utterance of speaker 40 (step 6) indexes past the table. The lookup runs inside torch.autocast.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

NUM_SPEAKERS, NUM_KEYWORDS, N_MELS = 40, 12, 20


class Manifest(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(12)
        self.items = []
        for i in range(size):
            mel = torch.randn(N_MELS, 50, generator=g)
            speaker = min(i // 4, NUM_SPEAKERS + 3)  # utterances sorted by speaker
            self.items.append((mel, speaker, i % NUM_KEYWORDS))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


class KWS(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frontend = nn.Sequential(nn.Conv1d(N_MELS, 64, 5, padding=2), nn.GELU(),
                                      nn.Conv1d(64, 64, 5, padding=2, stride=2), nn.GELU())
        self.speaker_embed = nn.Embedding(NUM_SPEAKERS, 64)
        self.classifier = nn.Linear(64, NUM_KEYWORDS)

    def forward(self, mel: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        h = self.frontend(mel).mean(-1)
        h = h + self.speaker_embed(speaker)  # reprocut: culprit
        return self.classifier(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=24)
    args = parser.parse_args()

    torch.manual_seed(0)
    device_type = torch.device(args.device).type
    amp_dtype = torch.bfloat16
    model = KWS().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Manifest(240), batch_size=args.batch_size)
    for step, (mel, speaker, keyword) in enumerate(loader):
        mel, speaker, keyword = mel.to(args.device), speaker.to(args.device), keyword.to(args.device)
        with torch.autocast(device_type=device_type, dtype=amp_dtype):
            logits = model(mel, speaker)
            loss = F.cross_entropy(logits.float(), keyword)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
