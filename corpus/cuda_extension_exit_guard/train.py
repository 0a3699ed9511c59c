"""Classify video clips from per-clip sums of frame features (CUDA only).

The frames of a video are pooled into clips of FRAMES_PER_CLIP frames by `clippool::segment_sum`,
a CUDA C++ operator built at import with `cpp_extension.load_inline` and registered with a
TORCH_LIBRARY block (its backward is registered from Python). The module stops at once on a
machine without a GPU. Bug: a frame's clip id is computed from its frame number in the source
recording (`first_frame + arange`), not from its place in the video. The videos of the first
steps are cut from the start of their recordings (first frame 0), so the ids run 0..7; the
video of step 4 is cut from a long surveillance recording, 20,000,000 frames in: its clip ids
are 2,500,000 and up for an output of 8 clips, and the kernel's atomicAdd writes 2.4 TiB past
the end of its 8 MiB output, far from any allocation: an illegal memory access.
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

    def forward(self, frames: torch.Tensor, first_frame: int) -> torch.Tensor:
        frame_numbers = first_frame + torch.arange(frames.shape[0], device=frames.device)
        clip_of_frame = frame_numbers // FRAMES_PER_CLIP
        clips = frames.shape[0] // FRAMES_PER_CLIP
        scaled = frames * self.gain
        pooled = torch.ops.clippool.segment_sum(scaled, clip_of_frame, clips)  # reprocut: culprit
        return self.head(pooled / FRAMES_PER_CLIP).mean(dim=0, keepdim=True)


def video(step: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One 64-frame video, its label and its first frame's number in its recording: 0, but
    20,000,000 at step 4 (a cut from a days-long surveillance recording)."""
    g = torch.Generator().manual_seed(step)
    pixels = torch.rand(64, FRAME_FEATURES, generator=g)
    first_frame = 20_000_000 if step == 4 else 0
    return pixels.to(DEVICE), torch.randint(0, CLASSES, (1,), generator=g).to(DEVICE), first_frame


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
        frames, label, first_frame = video(step)
        loss = F.cross_entropy(model(frames, first_frame), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} frames {frames.shape[0]} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
