"""`tok::pack`: token id sequences packed into fixed-width rows, defined with a
torch.library.Library. A compiled packer is used when its package is installed; otherwise the
pure torch kernel below is registered for the CPU."""

import torch

try:
    from fast_tokens import pack_cpu  # optional: a compiled packer
except ImportError:
    HAVE_FAST_TOKENS = False
else:
    HAVE_FAST_TOKENS = True

PAD = 0

lib = torch.library.Library("tok", "DEF")
lib.define("pack(Tensor ids, Tensor lengths, int width) -> Tensor")

if HAVE_FAST_TOKENS:
    lib.impl("pack", pack_cpu, "CPU")
else:

    def _pack(ids: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
        longest = int(lengths.max())
        if longest > width:
            raise ValueError(f"a sequence of {longest} tokens does not fit in {width} columns")
        rows = torch.full((lengths.shape[0], width), PAD, dtype=ids.dtype)
        starts = torch.cumsum(lengths, 0) - lengths
        for row, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            rows[row, :length] = ids[start : start + length]
        return rows

    lib.impl("pack", _pack, "CPU")


@torch.library.register_fake("tok::pack")
def _(ids: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    return ids.new_empty((lengths.shape[0], width))
