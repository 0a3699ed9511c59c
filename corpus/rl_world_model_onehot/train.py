"""Train a small world model (next-observation predictor) from replayed transitions.

Bug: the action encoder one-hot encodes with `num_actions` from the env's action space (6), but
a later batch of transitions comes from an env version that added a NOOP action (id 6).
F.one_hot is composite: no single aten op raises on CPU; on CUDA the scatter_ inside asserts.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_ACTIONS, OBS_DIM = 6, 10


class ReplayBuffer:
    def __init__(self, capacity: int) -> None:
        g = torch.Generator().manual_seed(8)
        self.obs = torch.randn(capacity, OBS_DIM, generator=g)
        self.actions = torch.randint(0, NUM_ACTIONS, (capacity,), generator=g)
        self.actions[capacity // 2 + 7] = NUM_ACTIONS  # NOOP from the newer env version
        self.next_obs = self.obs + 0.1 * torch.randn(capacity, OBS_DIM, generator=g)

    def batch(self, step: int, size: int):
        index = torch.arange(step * size, (step + 1) * size) % len(self.obs)
        return self.obs[index], self.actions[index], self.next_obs[index]


class WorldModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_actions = NUM_ACTIONS
        self.net = nn.Sequential(nn.Linear(OBS_DIM + NUM_ACTIONS, 64), nn.Tanh(),
                                 nn.Linear(64, OBS_DIM))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        action_vec = F.one_hot(action, self.num_actions).to(obs.dtype)  # reprocut: culprit
        return obs + self.net(torch.cat([obs, action_vec], dim=-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    buffer = ReplayBuffer(1024)
    model = WorldModel().to(args.device)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        obs, action, next_obs = (t.to(args.device) for t in buffer.batch(step, args.batch_size))
        loss = F.mse_loss(model(obs, action), next_obs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 2 == 0:
            print(f"step {step} model loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
