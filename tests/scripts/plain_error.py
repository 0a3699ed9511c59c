import torch

config = {"lr": 0.1}
model = torch.nn.Linear(2, 2)
print(config["momentum"])
