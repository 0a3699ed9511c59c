"""A small regression model that trains healthily, then at --nan-at meets a dead sensor row:
its per-row std is 0, (x - mean) / std is 0 / 0 = NaN, and training goes on silently."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--nan-at", type=int, default=150)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(16, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 1),
).to(args.device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(args.nan_at + 10):
    x = torch.randn(64, 16, device=args.device)
    y = x[:, :4].sum(1)
    if step == args.nan_at:
        x[5] = 0.0  # the sensor died
    x = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
    loss = F.mse_loss(model(x).squeeze(-1), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0 or step >= args.nan_at:
        print(step, loss.item(), flush=True)
