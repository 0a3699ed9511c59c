"""Graph classification with a C++ segment-sum operator (`seglib::segment_sum`, a TORCH_LIBRARY
block built by cpp_extension.load_inline), after module-level guards that stop the script on a
machine that cannot build it. Bug: from step 4 the batcher counts graphs from 1 for the last
graph of a batch, so one node's segment id equals the number of graphs."""

import argparse
import shutil
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if shutil.which("ninja") is None:
    sys.exit("building seglib needs ninja on PATH")
if sys.platform != "linux":
    raise SystemExit("seglib is only built on Linux")

SEGLIB_CPP = r"""
#include <ATen/ATen.h>
#include <torch/library.h>

at::Tensor segment_sum_cpu(const at::Tensor& src, const at::Tensor& segments, int64_t count) {
  TORCH_CHECK(src.scalar_type() == at::kFloat, "segment_sum takes float32 rows");
  TORCH_CHECK(segments.size(0) == src.size(0), "one segment id per row");
  auto rows = src.contiguous();
  auto ids = segments.contiguous();
  auto out = at::zeros({count, rows.size(1)}, rows.options());
  const int64_t width = rows.size(1);
  const float* in = rows.data_ptr<float>();
  const int64_t* id = ids.data_ptr<int64_t>();
  float* sums = out.data_ptr<float>();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < count, "segment id ", id[i], " out of range for ", count,
                " segments");
    for (int64_t j = 0; j < width; ++j) sums[id[i] * width + j] += in[i * width + j];
  }
  return out;
}

TORCH_LIBRARY(seglib, m) {
  m.def("segment_sum(Tensor src, Tensor segments, int count) -> Tensor");
}

TORCH_LIBRARY_IMPL(seglib, CPU, m) {
  m.impl("segment_sum", &segment_sum_cpu);
}
"""

load_inline(
    name="seglib_layout_cpu",
    cpp_sources=SEGLIB_CPP,
    is_python_module=False,
    no_implicit_headers=True,
)


def _segment_sum_setup(ctx, inputs, output) -> None:
    _, segments, _ = inputs
    ctx.save_for_backward(segments)


def _segment_sum_backward(ctx, grad: torch.Tensor):
    (segments,) = ctx.saved_tensors
    return grad[segments], None, None


torch.library.register_autograd(
    "seglib::segment_sum", _segment_sum_backward, setup_context=_segment_sum_setup
)


class GraphClassifier(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.node = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, graph_of_node: torch.Tensor, graphs: int) -> torch.Tensor:
        h = F.relu(self.node(x))
        pooled = torch.ops.seglib.segment_sum(h, graph_of_node, graphs)
        return self.head(pooled)


def batch(step: int, graphs: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    sizes = torch.randint(2, 5, (graphs,), generator=g)
    graph_of_node = torch.repeat_interleave(torch.arange(graphs), sizes)
    if step >= 4:  # the last graph's ids now count from 1
        graph_of_node[-1] += 1
    x = torch.randn(int(sizes.sum()), 8, generator=g)
    return x, graph_of_node, torch.randint(0, 3, (graphs,), generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GraphClassifier().to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        x, graph_of_node, labels = batch(step)
        loss = F.cross_entropy(model(x, graph_of_node, 4), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
