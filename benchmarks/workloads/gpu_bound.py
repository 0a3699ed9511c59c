"""Healthy, GPU-bound training: a wide MLP on large batches (few, long kernels)."""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
torch.manual_seed(0)
width = 8192 if args.device == "cuda" else 512
batch = 8192 if args.device == "cuda" else 256
model = torch.nn.Sequential(
    torch.nn.Linear(width, width),
    torch.nn.GELU(),
    torch.nn.Linear(width, width),
    torch.nn.GELU(),
    torch.nn.Linear(width, 10),
).to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(batch, width, device=args.device)
y = torch.randint(0, 10, (batch,), device=args.device)
start = None
for step in range(args.steps):
    if step == 2:  # warm-up done
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if args.device == "cuda":
    torch.cuda.synchronize()
print(f"LOOP_SECONDS {time.perf_counter() - start:.4f}")
