"""Which frameworks the user's script imported, and their versions, read in the user's process.

A maintainer's first question after the torch version is "which transformers / Lightning?".
`torch.utils.collect_env` answers it from what is installed; this answers it from what the
failing process actually had in `sys.modules`, so it never names a package the script did not
use, nor a version other than the one that ran.
"""

from __future__ import annotations

import importlib.metadata
import sys

# Top-level module name -> distribution name, for the libraries that train or feed models.
FRAMEWORKS = {
    "transformers": "transformers",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "pytorch_lightning": "pytorch-lightning",
    "torchvision": "torchvision",
    "torchaudio": "torchaudio",
    "torchtext": "torchtext",
    "timm": "timm",
    "peft": "peft",
    "trl": "trl",
    "datasets": "datasets",
    "diffusers": "diffusers",
    "deepspeed": "deepspeed",
    "fairscale": "fairscale",
    "torchmetrics": "torchmetrics",
    "xformers": "xformers",
    "flash_attn": "flash-attn",
    "bitsandbytes": "bitsandbytes",
    "apex": "apex",
    "triton": "triton",
    "numpy": "numpy",
    "cupy": "cupy",
}


def imported_frameworks(modules: dict[str, object] | None = None) -> dict[str, str]:
    """{module name: version} for the known frameworks imported in this process."""
    modules = sys.modules if modules is None else modules
    found: dict[str, str] = {}
    for name, distribution in FRAMEWORKS.items():
        module = modules.get(name)
        if module is None:
            continue
        version = getattr(module, "__version__", None)
        if not isinstance(version, str):
            try:
                version = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                version = "unknown"
        found[name] = version
    return found
