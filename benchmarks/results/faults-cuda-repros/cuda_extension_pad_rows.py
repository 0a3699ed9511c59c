"""compute-sanitizer (memcheck):
  Invalid __global__ write of size 4 bytes in pack_rows_kernel(const float *, const long *, float *, long, long, long)
  thread (0,0,0) in block (8,3,0): writes 4 B at 576.0 MiB before the start of `frames`
  host: pack_rows_cuda < c10::impl::detail::WrapFunctionIntoRuntimeFunctor_<at::Tensor  < c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoRuntimeFunctor_<at::Tensor  < std::decay<c10::guts::infer_function_traits<c10::impl::detail::WrapFunctionIntoRuntimeFunctor_<at::Tensor 
  at least 20 errors (memcheck stopped after printing them)
"""

from __future__ import annotations

import argparse

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
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

BATCH, MAX_LEN, DIM, CLASSES = 4, 8, 1 << 22, 10


def clips(step: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(1, MAX_LEN, (BATCH,), generator=g)
    if step >= 5:
        lengths[-1] = MAX_LEN
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    frames = torch.randn(BATCH, MAX_LEN, DIM, device=device)
    return frames, lengths.to(device), labels.to(device)


class ClipClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(MAX_LEN, CLASSES)

    def forward(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = torch.ops.rowpad.pack_rows(torch.randn((4, 8, 4194304), dtype=torch.float32, device='cuda:0'), lengths, MAX_LEN)
        energy = packed.mean(dim=-1)
        return self.head(energy)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ClipClassifier().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        frames, lengths, labels = clips(step, args.device)
        loss = F.cross_entropy(model(frames, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
torch.cuda.synchronize()
