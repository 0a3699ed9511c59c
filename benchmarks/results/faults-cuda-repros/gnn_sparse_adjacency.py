"""Minimal reproduction of a failure in aten::_sparse_addmm.

Expected: AcceleratorError (CUDA error 700) in aten::_sparse_addmm: an illegal memory access was encountered
Message: CUDA error: an illegal memory access was encountered
Call: torch.sparse.mm
Original: x (1200, 1200), mat2 (1200, 32)
  x: column index max 3291174267 ≥ size 1200 (40 of 7882 entries)
Data: mixed: captured values where they matter, generated elsewhere
CPU: reproduces too (RuntimeError: addmm: index out of column bound: 2135904755 not between 1 and 1)

Seen on:
  torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04
  GPU NVIDIA H100 80GB HBM3, Python 3.12.3, Linux-6.18.44-fc-v1252-gpu-x86_64-with-glibc2.39

Run: python repro.py

compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in void cusparse::csrmv_v3_kernel<std::integral_constant<bool, (bool)0>, int, int, float, float, float, float, void>(cusparse::KernelCoeffs<T7>, const T3 *, const T2 *, const T3 *, const T4 *, T2, int, int, const T5 *, T6 *, T3 *, T7 *)
  thread (0,0,0) in block (0,0,0): reads 4 B at 8.0 GiB after the end of `mat2` (arg 1)
  host: [libcusparse.so.12] < [libcusparse.so.12] < [libcusparse.so.12] < [libcusparse.so.12]
  3 error(s) in all
"""

import torch


def main():
    torch.manual_seed(0)
    x_indices = torch.zeros(2, dtype=torch.int64, device="cuda:0").as_strided((2, 1), (1, 2))
    x_indices.copy_(torch.tensor([[0], [2135904755]], device="cuda:0"))
    x_values = torch.randn(1, device="cuda:0")
    x = torch.sparse_coo_tensor(x_indices, x_values, (1, 1), check_invariants=False, is_coalesced=True)
    mat2 = torch.zeros(1, 1, device="cuda:0")
    torch.sparse.mm(x, mat2)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
