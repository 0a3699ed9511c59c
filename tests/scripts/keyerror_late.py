"""A plain Python error at step 3 of a training loop: appends a line to argv[1] each time it
starts, so a test can count how often reprocut ran it."""

import sys

import torch

with open(sys.argv[1], "a") as starts:
    starts.write("start\n")
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
config = {"lr": 0.1}
for step in range(6):
    loss = model(torch.randn(3, 4)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step == 3:
        print(config["momentum"])
