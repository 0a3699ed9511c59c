"""torch.compile under the recorder: run eagerly, and remember that it was asked for.

Ops inside compiled graphs never reach the dispatch modes, so the recording runs the model
eagerly: `torch.compile` and `torch._dynamo.optimize` hand back what they were given, and their
use is noted (the parent then runs the script once more compiled, for the verdict). Scripts that
run Inductor another way (AOTInductor after `torch.export`) are seen by its module having been
imported. The Inductor settings the script changed (`torch._inductor.config`) are read at the
end: a compiler bug report lists them.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

# integer tensors up to this size keep their values in the first call's specs (ids, indices:
# where values matter); larger ones and floating tensors are rebuilt from their specs
LITERAL_LIMIT = 4096


class CompileUse:
    """Patches torch.compile and torch._dynamo.optimize for the run; `names` what was compiled."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.names: list[str] = []
        # the specs of each compiled callable's first call's positional arguments (JSON; None
        # for an argument that is not a tensor): a compile-only repro calls it with such inputs
        self.first_calls: dict[str, list[dict[str, Any] | None]] = {}
        self._compile = torch.compile
        self._optimize: Any = None

    def __enter__(self) -> CompileUse:
        self.torch.compile = self._eager_compile
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:  # imported by `import torch` in the versions supported
            self._optimize = dynamo.optimize
            dynamo.optimize = self._eager_optimize
        return self

    def __exit__(self, *exc: object) -> None:
        self.torch.compile = self._compile
        if self._optimize is not None:
            sys.modules["torch._dynamo"].optimize = self._optimize

    def _eager_compile(self, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if model is None:  # used as @torch.compile(...)
            return self._note
        return self._note(model)

    def _eager_optimize(self, *args: Any, **kwargs: Any) -> Any:
        self.names.append("torch._dynamo.optimize")
        return lambda fn: fn

    def _note(self, model: Any) -> Any:
        name = getattr(model, "__name__", type(model).__name__)
        self.names.append(name)
        if isinstance(model, self.torch.nn.Module):
            model.register_forward_pre_hook(lambda _, args: self._first_call(name, args))
            return model
        if not callable(model):
            return model

        @functools.wraps(model)
        def eager(*args: Any, **kwargs: Any) -> Any:
            self._first_call(name, args)
            return model(*args, **kwargs)

        return eager

    def _first_call(self, name: str, args: tuple[Any, ...]) -> None:
        if name in self.first_calls:
            return
        torch_c = self.torch._C
        with torch_c.DisableTorchFunction(), torch_c._DisableTorchDispatch():  # not the user's ops
            self.first_calls[name] = [_spec_json(self.torch, arg) for arg in args]

    def used(self) -> list[str]:
        """What was compiled; Inductor imported by other paths counts too."""
        if not self.names and "torch._inductor.compile_fx" in sys.modules:
            return ["torch._inductor (AOTInductor or another path)"]
        return list(dict.fromkeys(self.names))


def _spec_json(torch: Any, arg: Any) -> dict[str, Any] | None:
    """A tensor argument's spec as JSON, an integer one's values kept (None: not a tensor)."""
    from reprocut.model.case import Literal, spec_to_json
    from reprocut.model.tensors import spec_of

    if not isinstance(arg, torch.Tensor) or arg.is_sparse:
        return None
    values = None
    if not (arg.is_floating_point() or arg.is_complex()) and arg.numel() <= LITERAL_LIMIT:
        values = Literal(tuple(arg.detach().cpu().reshape(-1).tolist()))
    return spec_to_json(spec_of(arg.detach(), values))


def inductor_settings() -> dict[str, str]:
    """The `torch._inductor.config` settings that differ from their defaults, as text."""
    config = sys.modules.get("torch._inductor.config")
    if config is None:
        try:
            import torch._inductor.config as config
        except ImportError:
            return {}
    is_default = getattr(config, "_is_default", None)
    names = getattr(config, "_config", {})
    if is_default is None:
        return {}
    changed: dict[str, str] = {}
    for name in names:
        try:
            if not is_default(name):
                changed[name] = repr(getattr(config, name))
        except Exception:  # a setting whose value cannot be read here: not worth failing for
            continue
    return changed
