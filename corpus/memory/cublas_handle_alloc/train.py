"""A serving loop that sizes its key/value cache from the free memory, keeping a 64 MiB margin
"for the rest", before it runs anything. The first projection is the process's first matmul:
cuBLAS creates its handle then and allocates device memory of its own, straight from the
driver, outside PyTorch's caching allocator, and finds none: CUBLAS_STATUS_ALLOC_FAILED when
calling cublasCreate. (On an H200 with torch 2.11 every margin from 4 to 64 MiB failed so.)"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--margin-mib", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = nn.Linear(1024, 1024).to(device)
    free, _ = torch.cuda.mem_get_info(device)
    cache_bytes = free - (args.margin_mib << 20)
    kv_cache = torch.empty(cache_bytes // 2, dtype=torch.float16, device=device)  # the rest
    print(f"kv cache: {kv_cache.numel() * 2 / 2**30:.2f} GiB")
    for step in range(3):
        requests = torch.randn(32, 1024, device=device)
        with torch.no_grad():
            out = model(requests)  # reprocut: culprit
        print(f"step {step}: {out.norm().item():.3f}")


if __name__ == "__main__":
    main()
