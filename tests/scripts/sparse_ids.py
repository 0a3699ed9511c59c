"""A tiny graph layer whose sparse adjacency holds a column id past its size (CPU raises)."""

import torch


def adjacency(n: int, edges: int, bad: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, n, (edges,), generator=g)
    cols = torch.randint(0, n, (edges,), generator=g)
    cols[edges // 2] = bad  # an id from a larger graph
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(edges), (n, n))


def main() -> None:
    n = 40
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(n, 8)
    for step in range(3):
        adj = adjacency(n, 120, n + 7 if step == 1 else 0)
        h = torch.sparse.mm(adj, x)
        print(step, layer(h).sum().item())


main()
