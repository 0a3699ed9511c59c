"""A DQN-shaped loop: the optimizer starts after a warm-up, so its step count is not the loop's.

The lookup goes out of range at episode 2, t 3 (transition 20), after 9 optimizer steps.
"""

import torch

torch.manual_seed(0)
q_net = torch.nn.Sequential(torch.nn.Embedding(6, 8), torch.nn.Linear(8, 2))
optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3)
warmup, transitions = 10, 0
for episode in range(4):
    for t in range(8):
        transitions += 1
        state = torch.tensor([transitions % 6])
        if (episode, t) == (2, 3):
            state = torch.tensor([6])  # a state id past the table
        q = q_net(state)
        if transitions > warmup:
            loss = q.pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
