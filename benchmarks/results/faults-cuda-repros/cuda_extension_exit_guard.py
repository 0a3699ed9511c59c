"""Minimal reproduction of a failure in clippool::segment_sum.

Expected: AcceleratorError (CUDA error 700) in clippool::segment_sum: an illegal memory access was encountered
Message: CUDA error: an illegal memory access was encountered
Call: torch.ops.clippool.segment_sum.default
Original: t0 (64, 262144), t1 (64,)
  t1: values in [2500000, 2500007]
Data: mixed: captured values where they matter, generated elsewhere
CPU: not checked (torch.ops.clippool.segment_sum.default has no CPU kernel)

Seen on:
  torch 2.11.0+cu130, CUDA 13.0, driver 580.159.04
  GPU NVIDIA H100 80GB HBM3, Python 3.12.3, Linux-6.18.44-fc-v1252-gpu-x86_64-with-glibc2.39

Run: python repro.py

compute-sanitizer (memcheck):
  Invalid __global__ atomic of size 4 bytes in segment_sum_kernel(const float *, const long *, float *, long)
  thread (0,0,0) in block (0,0,0): atomically updates 4 B at 76.4 MiB after the end of `t1` (arg 1)
  host: segment_sum_cuda < c10::impl::detail::WrapFunctionIntoRuntimeFunctor_<at::Tensor  < c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoRuntimeFunctor_<at::Tensor  < std::decay<c10::guts::infer_function_traits<c10::impl::detail::WrapFunctionIntoRuntimeFunctor_<at::Tensor 
  10 error(s) in all
"""

import torch
from torch.utils.cpp_extension import load_inline

CLIPPOOL_CPP = r"""
#include <torch/library.h>

at::Tensor segment_sum_cuda(const at::Tensor& src, const at::Tensor& segments, int64_t count);

TORCH_LIBRARY(clippool, m) {
  m.def("segment_sum(Tensor src, Tensor segments, int count) -> Tensor");
}

TORCH_LIBRARY_IMPL(clippool, CUDA, m) {
  m.impl("segment_sum", &segment_sum_cuda);
}
"""

CLIPPOOL_CUDA = r"""
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

__global__ void segment_sum_kernel(const float* __restrict__ src,
                                   const int64_t* __restrict__ segments,
                                   float* __restrict__ out, int64_t width) {
  const int64_t row = blockIdx.y;
  const int64_t segment = segments[row];  // trusted: no bounds check in the hot loop
  for (int64_t d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; d < width;
       d += (int64_t)gridDim.x * blockDim.x) {
    atomicAdd(out + segment * width + d, src[row * width + d]);
  }
}

at::Tensor segment_sum_cuda(const at::Tensor& src, const at::Tensor& segments, int64_t count) {
  TORCH_CHECK(src.is_cuda() && src.scalar_type() == at::kFloat, "float32 CUDA rows expected");
  auto rows = src.contiguous();
  auto ids = segments.contiguous();
  auto out = at::zeros({count, rows.size(1)}, rows.options());
  const int64_t width = rows.size(1);
  dim3 grid((unsigned)std::min<int64_t>((width + 255) / 256, 1024), (unsigned)rows.size(0));
  segment_sum_kernel<<<grid, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      rows.data_ptr<float>(), ids.data_ptr<int64_t>(), out.data_ptr<float>(), width);
  return out;
}
"""

load_inline(
    name="clippool_ext",
    cpp_sources=CLIPPOOL_CPP,
    cuda_sources=CLIPPOOL_CUDA,
    is_python_module=False,
    extra_cuda_cflags=["-O3"],
)


def _segment_sum_setup(ctx, inputs, output) -> None:
    _, segments, _ = inputs
    ctx.save_for_backward(segments)


def _segment_sum_backward(ctx, grad: torch.Tensor):
    (segments,) = ctx.saved_tensors
    return grad.index_select(0, segments), None, None


torch.library.register_autograd(
    "clippool::segment_sum", _segment_sum_backward, setup_context=_segment_sum_setup
)


def main():
    t0 = torch.zeros(1, 8, device="cuda:0")
    t1 = torch.tensor([2500007], device="cuda:0")
    torch.ops.clippool.segment_sum.default(t0, t1, 8)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
