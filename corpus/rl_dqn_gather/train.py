"""Train a DQN agent on a synthetic gridworld with a replay buffer.

Bug: the Q-network has one output per action (4), but the behaviour policy's epsilon-greedy
branch samples from `range(num_actions + 1)` (an off-by-one introduced with a "stay" action).
The first random "stay" action lands in a minibatch at step 9, and q.gather indexes column 4.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_ACTIONS, OBS_DIM = 4, 8


class GridWorld:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state = torch.zeros(OBS_DIM)

    def step(self, action: int) -> tuple[torch.Tensor, float, bool]:
        self.state = torch.roll(self.state, 1) + 0.1 * action
        return self.state.clone(), float(action == 2), self.rng.random() < 0.05


class QNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(OBS_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.q = nn.Linear(64, NUM_ACTIONS)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.body(obs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gamma", type=float, default=0.99)
    args = parser.parse_args()

    torch.manual_seed(0)
    rng = random.Random(0)
    env = GridWorld(seed=1)
    online, target = QNet().to(args.device), QNet().to(args.device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-3)
    replay: list[tuple] = []
    obs = env.state.clone()
    for step in range(args.steps):
        for t in range(args.batch_size):  # collect with epsilon-greedy
            epsilon = 0.0 if step < 9 else 0.05
            if rng.random() < epsilon:
                action = rng.choice(range(NUM_ACTIONS + 1))
            else:
                with torch.no_grad():
                    action = int(online(obs.to(args.device)).argmax())
            next_obs, reward, done = env.step(action)
            replay.append((obs, action, reward, next_obs, done))
            obs = next_obs
        batch = replay[-args.batch_size:]
        states = torch.stack([b[0] for b in batch]).to(args.device)
        actions = torch.tensor([b[1] for b in batch], device=args.device)
        rewards = torch.tensor([b[2] for b in batch], device=args.device)
        next_states = torch.stack([b[3] for b in batch]).to(args.device)
        dones = torch.tensor([b[4] for b in batch], dtype=torch.float32, device=args.device)
        q = online(states).gather(1, actions[:, None]).squeeze(1)  # reprocut: culprit
        with torch.no_grad():
            q_next = target(next_states).max(1).values
        loss = F.smooth_l1_loss(q, rewards + args.gamma * (1 - dones) * q_next)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            target.load_state_dict(online.state_dict())
            print(f"step {step} td loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
