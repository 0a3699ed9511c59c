"""A small LM that trains healthily for --fail-at steps, then meets a token id == vocab size."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int, default=150)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
torch.manual_seed(0)
vocab, dim = 5000, 128
embed = torch.nn.Embedding(vocab, dim).to(args.device)
body = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.ReLU(), torch.nn.Linear(dim, vocab))
body = body.to(args.device)
params = list(embed.parameters()) + list(body.parameters())
optimizer = torch.optim.AdamW(params, lr=1e-3)
for step in range(args.fail_at + 10):
    ids = torch.randint(0, vocab, (16, 64), device=args.device)
    if step == args.fail_at:
        ids[3, 7] = vocab
    logits = body(embed(ids))  # reprocut: culprit
    loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(step, loss.item())
