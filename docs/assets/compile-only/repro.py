import torch


@torch.library.custom_op("corpus::trim_last", mutates_args=())
def trim_last(x: torch.Tensor) -> torch.Tensor:
    return x[:-1].clone()


@trim_last.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x


@torch.compile
def pooled_stats(hidden: torch.Tensor) -> torch.Tensor:
    return trim_last(hidden)


pooled_stats(torch.randn((8, 4)))
