"""`rowpad::pack_rows`, a CUDA C++ operator built with `cpp_extension.load_inline` and registered
with TORCH_LIBRARY: packs the first `lengths[b]` frames of each clip and writes an end marker
(a row of -1) right after them.

The kernel launches one block per row 0..max_len, so a clip of exactly `max_len` frames gets its
end marker at row `max_len`: one row past its slot, and for the batch's last clip one row past
the output. (The fix: launch `max_len` rows, or allocate `max_len + 1`.)
"""

from __future__ import annotations

from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/library.h>

at::Tensor pack_rows_cuda(const at::Tensor& x, const at::Tensor& lengths, int64_t max_len);

TORCH_LIBRARY(rowpad, m) {
  m.def("pack_rows(Tensor x, Tensor lengths, int max_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(rowpad, CUDA, m) {
  m.impl("pack_rows", &pack_rows_cuda);
}
"""

_CUDA = r"""
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

__global__ void pack_rows_kernel(const float* __restrict__ x, const int64_t* __restrict__ lengths,
                                 float* __restrict__ out, int64_t frames, int64_t max_len,
                                 int64_t dim) {
  int64_t t = blockIdx.x, b = blockIdx.y;  // rows 0..max_len: the end marker's row included
  int64_t len = lengths[b];
  if (t > len) return;
  float* row = out + (b * max_len + t) * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    row[d] = t < len ? x[(b * frames + t) * dim + d] : -1.0f;  // t == len: the end marker
  }
}

at::Tensor pack_rows_cuda(const at::Tensor& x, const at::Tensor& lengths, int64_t max_len) {
  auto out = at::zeros({x.size(0), max_len, x.size(2)}, x.options());
  dim3 grid(max_len + 1, x.size(0));
  pack_rows_kernel<<<grid, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), lengths.data_ptr<int64_t>(), out.data_ptr<float>(), x.size(1),
      max_len, x.size(2));
  return out;
}
"""

load_inline(name="rowpad_ext", cpp_sources=_CPP, cuda_sources=_CUDA, is_python_module=False)
