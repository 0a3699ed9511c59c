"""Evaluation under torch.no_grad() with a DataLoader (2 workers) and a gather index off by one."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    torch.manual_seed(0)
    scores = torch.randn(64, 5)
    picks = torch.randint(0, 5, (64, 1))
    picks[40, 0] = 5
    loader = DataLoader(TensorDataset(scores, picks), batch_size=16, num_workers=2)
    model = torch.nn.Linear(5, 5)
    with torch.no_grad():
        for batch, (s, p) in enumerate(loader):
            out = model(s)
            chosen = out.gather(1, p)
            print(batch, float(chosen.mean()))


if __name__ == "__main__":
    main()
