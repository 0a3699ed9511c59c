"""Minimal reproduction of a failure in fused::gated.

Expected: AcceleratorError (CUDA error 700) in fused::gated: an illegal memory access was encountered
Message: CUDA error: an illegal memory access was encountered
Call: torch.ops.fused.gated.default
Original: t0 (128, 256, 4096), t1 (128, 256, 4096)
  t1: stride 0 in dims 0, 1 (an expand()ed view): 134217728 elements over 4096 of storage
Data: synthetic (generated tensors)
CPU: not checked (torch.ops.fused.gated.default has no CPU kernel)

Seen on:
  torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04
  GPU NVIDIA H100 80GB HBM3, Python 3.12.3, Linux-6.18.44-fc-v1252-gpu-x86_64-with-glibc2.39

Run: python repro.py

compute-sanitizer (memcheck):
  Invalid __global__ read of size 16 bytes in gated_kernel
  thread (0,0,0) in block (8,0,0): reads 16 B at 32.0 KiB after the end of `t1` (arg 1)
  host: launch < pybind11::object pybind11::detail::object_api<pybind11::handle>::operator < torch::impl::dispatch::PythonKernelHolder::operator < pybind11::object pybind11::detail::argument_loader<pybind11::object const&, c10::DispatchKeySet, pybind11::args, pybind11::kwargs const&>::call_impl<pybind11::object, torch::impl::dispatch::initDispatchBindings
  at least 20 errors (memcheck stopped after printing them)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def gated_kernel(x_ptr, g_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x * tl.sigmoid(g), mask=mask)


@torch.library.triton_op("fused::gated", mutates_args={})
def gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(gated_kernel)[(triton.cdiv(n, 1024),)](x, gate, out, n, BLOCK=1024)
    return out


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor):
    x, gate = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * s, grad * x * s * (1 - s)


gated.register_autograd(_backward, setup_context=_setup)


def main():
    t0 = torch.zeros(20971520, device="cuda:0")
    t1 = torch.zeros(1, device="cuda:0")
    torch.ops.fused.gated.default(t0, t1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
