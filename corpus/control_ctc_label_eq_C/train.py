"""Negative control: a CTC speech model whose targets contain label == C (silent on CUDA).

Bug: the character map grew to 29 symbols but the acoustic model still emits C = 28 classes
(blank included). Label 28 is out of range for ctc_loss, yet torch checks it neither on CPU nor
on the native CUDA path: the loss reads out of bounds and returns a finite number. The run
"succeeds"; reprocut record must not invent a failure (and cannot localize a silent one).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES, N_MELS = 28, 16  # index 0 is the CTC blank


class AcousticModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(N_MELS, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, NUM_CLASSES)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(mel)[0]).log_softmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = AcousticModel().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    frames, target_len = 50, 12
    for step in range(args.steps):
        mel = torch.randn(args.batch_size, frames, N_MELS, device=args.device)
        targets = torch.randint(1, NUM_CLASSES, (args.batch_size, target_len), device=args.device)
        if step >= 3:
            targets[1, 4] = NUM_CLASSES  # the apostrophe added to the character map
        log_probs = model(mel).transpose(0, 1)  # (T, N, C)
        input_lengths = torch.full((args.batch_size,), frames, dtype=torch.long, device=args.device)
        target_lengths = torch.full((args.batch_size,), target_len, dtype=torch.long,
                                    device=args.device)
        loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths)  # reprocut: culprit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} ctc {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
