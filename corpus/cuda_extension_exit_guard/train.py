"""Classify video clips from per-clip sums of frame features (CUDA only).

The frames of a video are pooled into clips of FRAMES_PER_CLIP frames by `clippool::segment_sum`,
a CUDA C++ operator built at import with `cpp_extension.load_inline` and registered with a
TORCH_LIBRARY block (its backward is registered from Python). The module stops at once on a
machine without a GPU. Bug: clip ids are `frame // FRAMES_PER_CLIP` while the number of clips
is `frames // FRAMES_PER_CLIP`, rounded down: the videos of the first steps are whole clips, but
the 100-frame video of step 4 leaves 4 frames in a clip 12 the output does not have, and the
kernel's atomicAdd writes one 1 MiB row past the end of its output: an illegal memory access
(the cache is emptied after each step, so the 12 MiB output is a fresh allocation of its own and
the row past it is not mapped).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE != "cuda":
    sys.exit("clippool is a CUDA extension: run this script on a machine with a GPU")

FRAME_FEATURES = 512 * 512  # one grayscale 512x512 frame: 1 MiB of float32
FRAMES_PER_CLIP = 8
CLASSES = 10

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


class ClipClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(FRAME_FEATURES))  # per-pixel normalization
        self.head = nn.Linear(FRAME_FEATURES, CLASSES)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        clip_of_frame = torch.arange(frames.shape[0], device=frames.device) // FRAMES_PER_CLIP
        clips = frames.shape[0] // FRAMES_PER_CLIP
        scaled = frames * self.gain
        pooled = torch.ops.clippool.segment_sum(scaled, clip_of_frame, clips)  # reprocut: culprit
        return self.head(pooled / FRAMES_PER_CLIP).mean(dim=0, keepdim=True)


def video(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One video's frames and its label: 64 frames, and a longer 100-frame video at step 4."""
    g = torch.Generator().manual_seed(step)
    frames = 100 if step == 4 else 64
    pixels = torch.rand(frames, FRAME_FEATURES, generator=g)
    return pixels.to(DEVICE), torch.randint(0, CLASSES, (1,), generator=g).to(DEVICE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")  # the guard above has checked it
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ClipClassifier().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        frames, label = video(step)
        loss = F.cross_entropy(model(frames), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()  # videos differ in length: hand the cached blocks back
        print(f"step {step} frames {frames.shape[0]} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
