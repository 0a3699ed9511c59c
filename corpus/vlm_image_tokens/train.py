"""Train a tiny vision-language captioner that splices image features into text positions.

Bug: image-token positions are computed on the untruncated prompt, then the sequence is cut to
`max_len`. For long prompts (first at step 7) the image tokens land past the end of the
truncated sequence, and the advanced-indexing write of image features into the hidden states
indexes position >= max_len.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, MAX_LEN, IMG_TOKENS, DIM = 500, 40, 4, 32


class TinyVLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vision = nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), nn.ReLU(), nn.Flatten(2))
        self.vision_proj = nn.Linear(16, DIM)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.decoder = nn.GRU(DIM, DIM, batch_first=True)
        self.lm_head = nn.Linear(DIM, VOCAB)

    def forward(self, images, input_ids, image_pos):
        img = self.vision_proj(self.vision(images).transpose(1, 2))[:, :IMG_TOKENS]
        hidden = self.embed(input_ids)
        rows = torch.arange(len(input_ids), device=input_ids.device)[:, None]
        hidden = hidden.index_put((rows, image_pos), img)  # reprocut: culprit
        out, _ = self.decoder(hidden)
        return self.lm_head(out)


def make_batch(step: int, batch: int):
    g = torch.Generator().manual_seed(step)
    images = torch.randn(batch, 3, 8, 8, generator=g)
    prompt_len = 38 if step == 7 else 12  # a long system prompt
    starts = torch.full((batch, 1), prompt_len)
    image_pos = starts + torch.arange(IMG_TOKENS)  # computed before truncation
    ids = torch.randint(0, VOCAB, (batch, prompt_len + IMG_TOKENS + 20), generator=g)
    return images, ids[:, :MAX_LEN], image_pos


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyVLM().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        images, ids, image_pos = (t.to(args.device) for t in make_batch(step, args.batch_size))
        logits = model(images, ids, image_pos)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
