import sys

import torch

print(torch.ones(2).sum().item())
sys.exit(3)
