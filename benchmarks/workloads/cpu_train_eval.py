"""A CPU training loop of the kind users report: a tiny character-level LM trained for 3,000
iterations, evaluated over 4,000 batches, then asked to generate text, which fails.

Adapted from the common report "IndexError: index out of range in self" in a `generate()` that
feeds the growing context to the model without cropping it to `block_size`: the position
embedding is asked for position `block_size`. Prints LOOP_SECONDS (training + evaluation, the first 5 iterations excluded).
"""

import argparse
import time

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=3000)
parser.add_argument("--eval-batches", type=int, default=4000)
args = parser.parse_args()
torch.manual_seed(0)
# One thread: the model's ops are too small to share, and on the shared 2-core machine the
# benchmark runs on, two OpenMP threads made the plain run 8x slower and erratic.
torch.set_num_threads(1)

text = "the quick brown fox jumps over the lazy dog. " * 40
chars = sorted(set(text))
vocab, block_size, dim, batch = len(chars), 8, 32, 16
data = torch.tensor([chars.index(c) for c in text])


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - block_size - 1, (batch,))
    x = torch.stack([data[i : i + block_size] for i in starts.tolist()])
    y = torch.stack([data[i + 1 : i + block_size + 1] for i in starts.tolist()])
    return x, y


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(block_size, dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1])
        h = self.tok(idx) + self.pos(positions)  # reprocut: culprit (after the loop)
        h = h + self.mlp(self.norm(h))
        return self.head(h)


@torch.no_grad()
def generate(model: TinyLM, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
    for _ in range(new_tokens):
        logits = model(idx)  # the context is never cropped to block_size
        probs = F.softmax(logits[:, -1], dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
    return idx


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
start = None
for step in range(args.iters):
    if step == 5:
        start = time.perf_counter()
    x, y = get_batch()
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 500 == 0:
        print(f"step {step}: loss {loss.item():.3f}")

model.eval()
total = 0.0
with torch.no_grad():
    for _ in range(args.eval_batches):
        x, y = get_batch()
        total += F.cross_entropy(model(x).view(-1, vocab), y.view(-1)).item()
print(f"eval loss {total / args.eval_batches:.3f}")
print(f"LOOP_SECONDS {time.perf_counter() - start:.4f}")

prompt = data[:1].view(1, 1)
print("".join(chars[i] for i in generate(model, prompt, 20)[0].tolist()))
