"""An MLP for 28x28 images fed the image batch unflattened: F.linear sees (64, 1, 28, 28)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))  # the bug: x.flatten(1) is missing
        return self.fc2(x)


torch.manual_seed(0)
model = MLP()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
for _step in range(3):
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
