"""Sampling from a policy whose logits overflow to NaN at step 3 (CUDA)."""

import torch

torch.manual_seed(0)
policy = torch.nn.Linear(16, 50).cuda()
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
for step in range(6):
    state = torch.randn(4, 16, device="cuda")
    logits = policy(state)
    if step == 3:
        logits = logits.clone()
        logits[1, 3] = float("nan")
    probs = torch.softmax(logits, dim=-1)
    actions = torch.multinomial(probs, 1)  # reprocut: culprit
    loss = -(torch.log(probs.gather(1, actions) + 1e-8)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
