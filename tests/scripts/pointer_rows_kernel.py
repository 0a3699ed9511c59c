"""A row-sum "kernel" launched from Python as a CuPy RawKernel is, handed raw pointers
(`x.data_ptr()`) and the row stride: it loads each row 16 bytes at a time (float4), so a row that
starts off a 16-byte boundary is a misaligned address. From step 2 on the features carry a bias
column (65 floats a row) and are sliced back to 64: every row but one in four starts misaligned.
The kernel object comes from a compiled library frame (as CuPy's does); on the CPU here."""

import torch

_LIBRARY = compile(
    "class RawKernel:\n"
    "    name = 'rowsum_vec4'\n"
    "    def __call__(self, grid, block, args):\n"
    "        x_ptr, out_ptr, rows, row_stride = args\n"
    "        for row in range(rows):\n"
    "            if (x_ptr + 4 * row_stride * row) % 16:\n"
    "                raise RuntimeError('CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address')\n",
    "fakecupy/_core/raw.pyx",
    "exec",
)
fakecupy: dict = {"__name__": "fakecupy"}
exec(_LIBRARY, fakecupy)
ROWSUM = fakecupy["RawKernel"]()


def rowsum(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0])
    rows = x.shape[0]
    ROWSUM((rows,), (64,), (x.data_ptr(), out.data_ptr(), rows, x.stride(0)))  # reprocut: culprit
    return out


for step in range(4):
    columns = 64 if step < 2 else 65  # the bias column, from step 2 on
    features = torch.randn(32, columns)
    print(step, float(rowsum(features[:, :64]).sum()))
