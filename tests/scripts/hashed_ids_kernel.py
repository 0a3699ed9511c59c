"""A hashed embedding-bag "kernel" launched from Python as a CuPy RawKernel is: it trusts its ids.
From step 2 on a new feature's raw hashes skip the modulo, and the launch raises the driver's
illegal-address error. The kernel object comes from a compiled library frame (as CuPy's does),
so the user's line is the launch; on the CPU here, so record's probe reads the ids there."""

import torch

_LIBRARY = compile(
    "class RawKernel:\n"
    "    name = 'hashed_bag'\n"
    "    def __call__(self, grid, block, args):\n"
    "        ids, table, out = args\n"
    "        if int(ids.max()) >= table.shape[0] or int(ids.min()) < 0:\n"
    "            raise RuntimeError(\n"
    "                'CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered')\n"
    "        out.copy_(table[ids].mean(1))\n",
    "fakecupy/_core/raw.pyx",
    "exec",
)
fakecupy: dict = {"__name__": "fakecupy"}
exec(_LIBRARY, fakecupy)
_KERNEL = fakecupy["RawKernel"]()
ROWS, DIM = 64, 4


def hashed_bag(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    out = torch.empty(ids.shape[0], table.shape[1])
    args = (ids.contiguous(), table, out)
    _KERNEL((1,), (128,), args)  # reprocut: culprit
    return out


table = torch.randn(ROWS, DIM)
for step in range(4):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 1 << 40, (8, 3), generator=g) % ROWS
    if step >= 2:  # the new field, appended after the modulo
        ids = torch.cat([ids, torch.arange(8).view(8, 1) + (1 << 40)], dim=1)
    pooled = hashed_bag(ids, table)
    print(step, float(pooled.sum()))
