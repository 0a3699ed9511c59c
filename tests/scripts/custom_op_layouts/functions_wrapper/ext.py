"""A C++ extension of plain functions (`functions=`: pybind11 bindings, outside the
dispatcher), built once on import."""

from torch.utils.cpp_extension import load_inline

RAGGED_CPP = r"""
at::Tensor ragged_mean(const at::Tensor& values, const at::Tensor& offsets) {
  TORCH_CHECK(values.scalar_type() == at::kFloat, "ragged_mean takes float32 values");
  auto v = values.contiguous();
  auto o = offsets.contiguous();
  const int64_t rows = o.size(0) - 1, width = v.size(1), total = v.size(0);
  auto out = at::zeros({rows, width}, v.options());
  const float* in = v.data_ptr<float>();
  const int64_t* off = o.data_ptr<int64_t>();
  float* mean = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(off[r] <= off[r + 1] && off[r + 1] <= total, "offsets ", off[r], "..",
                off[r + 1], " run past the ", total, " values");
    for (int64_t i = off[r]; i < off[r + 1]; ++i)
      for (int64_t j = 0; j < width; ++j) mean[r * width + j] += in[i * width + j];
    const float count = off[r + 1] > off[r] ? float(off[r + 1] - off[r]) : 1.0f;
    for (int64_t j = 0; j < width; ++j) mean[r * width + j] /= count;
  }
  return out;
}
"""

_C = load_inline(name="ragged_layout_cpu", cpp_sources=RAGGED_CPP, functions=["ragged_mean"])
