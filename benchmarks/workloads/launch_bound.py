"""Healthy, launch-bound training: a small MLP, many tiny kernels per step."""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
torch.manual_seed(0)
layers = []
for _ in range(6):
    layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 10)).to(args.device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
start = None
for step in range(args.steps):
    if step == 5:
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
    x = torch.randn(32, 64, device=args.device)
    y = torch.randint(0, 10, (32,), device=args.device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if args.device == "cuda":
    torch.cuda.synchronize()
print(f"LOOP_SECONDS {time.perf_counter() - start:.4f}")
