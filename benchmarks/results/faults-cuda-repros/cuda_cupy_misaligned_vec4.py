"""compute-sanitizer (memcheck):
  Invalid __global__ read of size 16 bytes in cmvn_vec4
  thread (0,0,0) in block (0,0,0): reads 16 B 0 B into the 2.2 KiB storage of `args[0]` (misaligned)
  host: __pyx_f_13cupy_backends_4cuda_3api_6driver_launchKernel < __pyx_f_4cupy_4cuda_8function__launch < __pyx_pw_4cupy_4cuda_8function_8Function_3__call__ < __pyx_pw_4cupy_5_core_3raw_9RawKernel_5__call__
  4 error(s) in all
"""

import torch

import cupy

torch.manual_seed(0)

_SOURCE = r"""
extern "C" __global__ void cmvn_vec4(const float* __restrict__ x, float* __restrict__ out,
                                     float mean, float inv_std, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int n4 = n / 4;
    if (i < n4) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = (v.x - mean) * inv_std; v.y = (v.y - mean) * inv_std;
        v.z = (v.z - mean) * inv_std; v.w = (v.w - mean) * inv_std;
        reinterpret_cast<float4*>(out)[i] = v;
    } else if (i - n4 < n % 4) {
        int j = n4 * 4 + (i - n4);
        out[j] = (x[j] - mean) * inv_std;
    }
}
"""
_KERNEL = cupy.RawKernel(_SOURCE, "cmvn_vec4")
mean = torch.randn((1742,)).as_strided((572,), (1,)).mean().item()
out = (0,)
args = (cupy.asarray(torch.randn((1742,), device='cuda:0').as_strided((572,), (1,), 1170)), cupy.asarray(out), mean, 0, 4)
_KERNEL((4,), (1,), args)
torch.cuda.synchronize()
