"""Minimal reproduction of a failure in qknorm::rms_scale.

Expected: AcceleratorError (CUDA error 700) in qknorm::rms_scale: an illegal memory access was encountered
Message: CUDA error: an illegal memory access was encountered
Call: torch.ops.qknorm.rms_scale.default
Original: t0 (8, 64, 1024, 16), t1 (16,)
  t0: not contiguous: stride (1048576, 16, 1024, 1) for shape (8, 64, 1024, 16)
Data: synthetic (generated tensors)
CPU: not checked (torch.ops.qknorm.rms_scale.default has no CPU kernel)

Seen on:
  torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04
  GPU NVIDIA H100 80GB HBM3, Python 3.12.3, Linux-6.18.44-fc-v1252-gpu-x86_64-with-glibc2.39

Run: python repro.py

compute-sanitizer (memcheck):
  Invalid __global__ read of size 4 bytes in rms_scale_kernel
  thread (0,0,0) in block (1096,0,0): reads 4 B at 291.7 KiB after the end of `t0` (arg 0)
  host: launch < pybind11::object pybind11::detail::object_api<pybind11::handle>::operator < torch::impl::dispatch::PythonKernelHolder::operator < pybind11::object pybind11::detail::argument_loader<pybind11::object const&, c10::DispatchKeySet, pybind11::args, pybind11::kwargs const&>::call_impl<pybind11::object, torch::impl::dispatch::initDispatchBindings
  at least 20 errors (memcheck stopped after printing them)
"""

import torch
import triton
import triton.language as tl

EPS = 1e-6


@triton.jit
def rms_scale_kernel(x_ptr, w_ptr, out_ptr, row_stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=0.0)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = x * tl.rsqrt(mean_square + eps) * w
    tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


@torch.library.triton_op("qknorm::rms_scale", mutates_args={})
def rms_scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    n_cols = x.shape[-1]
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    rows = x.numel() // n_cols
    block = triton.next_power_of_2(n_cols)
    torch.library.wrap_triton(rms_scale_kernel)[(rows,)](
        x, weight, out, x.stride(-2), n_cols, EPS, BLOCK=block
    )
    return out


def _setup(ctx, inputs, output) -> None:
    x, weight = inputs
    ctx.save_for_backward(x, weight)


def _backward(ctx, grad: torch.Tensor):
    x, weight = ctx.saved_tensors
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    scaled = grad * weight
    grad_x = r * scaled - x * r.pow(3) * (x * scaled).mean(-1, keepdim=True)
    grad_weight = (grad * x * r).reshape(-1, x.shape[-1]).sum(0)
    return grad_x, grad_weight


rms_scale.register_autograd(_backward, setup_context=_setup)


def main():
    t0 = torch.zeros(1047633, device="cuda:0").as_strided((1, 6, 1024, 1), (1048576, 16, 1024, 1))
    t1 = torch.zeros(1, device="cuda:0")
    torch.ops.qknorm.rms_scale.default(t0, t1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
