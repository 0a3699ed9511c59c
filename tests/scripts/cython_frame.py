"""A compiled extension's wrapper raising a library status error: its traceback frame is a
Cython one, with a relative `.pyx` file name, as CuPy's cuBLAS bindings give."""

import torch

_COMPILED = compile(
    "def sgemm(ld):\n    if ld == 0:\n        raise RuntimeError('CUBLAS_STATUS_INVALID_VALUE')\n",
    "fakeblas/cublas.pyx",
    "exec",
)
cublas: dict = {}
exec(_COMPILED, cublas)
for step in range(3):
    x = torch.ones(1, 8).expand(4, 8) if step == 2 else torch.ones(4, 8)
    cublas["sgemm"](x.stride(0))  # reprocut: culprit
