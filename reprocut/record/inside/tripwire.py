"""Asserting ops seen without a dispatch mode: Python kernels at the ADInplaceOrView key.

A TorchDispatchMode sees every op, and being there at all costs about 1.8x on a launch-bound
training loop (benchmarks/results/dispatch-overhead-*). The ops that can device-assert are few.
A kernel registered for just those at ADInplaceOrView runs Python for them alone. Every autograd
tensor passes that key, and for functional ops it is a fallthrough; the kernel redispatches below
it, so other ops pay nothing. In-place ops have a stock kernel there, and the replacement does what
it does: run below the key, then bump the version counter that autograd checks.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

# Called as handler(op, args, kwargs, run): `run()` runs the op itself and returns its result.
Handler = Callable[[Any, tuple[Any, ...], dict[str, Any], Callable[[], Any]], Any]

_KEY = "ADInplaceOrView"
_BELOW = torch._C._after_ADInplaceOrView_keyset


def _overloads(names: Iterable[str]) -> Iterable[tuple[str, Any, bool]]:
    """(registration name, overload, in place) for each overload a kernel can stand in for.

    Out= variants are left alone (they write an argument other than self), as are TorchScript
    list overloads (no tensor argument)."""
    for name in sorted(names):
        packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
        if packet is None:
            continue
        for overload_name in packet.overloads():
            op = getattr(packet, overload_name)
            arguments = op._schema.arguments
            if not any(isinstance(a.type, torch.TensorType) for a in arguments):
                continue
            writes = [
                i
                for i, a in enumerate(arguments)
                if a.alias_info is not None and a.alias_info.is_write
            ]
            if writes not in ([], [0]):
                continue
            registered = packet._qualified_op_name.split("::")[1]
            if overload_name != "default":
                registered += f".{overload_name}"
            yield registered, op, writes == [0]


class Tripwire:
    """Installs the kernels for `ops` (aten names) while open; `handler` sees each call."""

    def __init__(self, ops: Iterable[str], handler: Handler) -> None:
        self.ops = frozenset(ops)
        self.handler = handler
        self._library: Any = None
        self.installed: list[str] = []

    def __enter__(self) -> Tripwire:
        """Register the kernels; on a torch that cannot (no `with_keyset`, say) nothing stays
        registered and the error propagates: the recorder then watches every op instead."""
        library = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                # "Overriding a previously registered kernel": the stock in-place ones, on purpose
                warnings.simplefilter("ignore")
                for registered, op, in_place in _overloads(self.ops):
                    kernel = self._in_place_kernel(op) if in_place else self._kernel(op)
                    try:
                        library.impl(registered, kernel, _KEY, with_keyset=True)
                    except RuntimeError:  # an op this build has no dispatcher entry for
                        continue
                    self.installed.append(registered)
        except BaseException:
            library._destroy()
            self.installed.clear()
            raise
        self._library = library
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Unregister: the stock kernels come back."""
        if self._library is not None:
            with contextlib.suppress(Exception):
                self._library._destroy()
            self._library = None

    def _kernel(self, op: Any) -> Callable[..., Any]:
        handler = self.handler

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            return handler(
                op, args, kwargs, lambda: op.redispatch(keyset & _BELOW, *args, **kwargs)
            )

        return kernel

    def _in_place_kernel(self, op: Any) -> Callable[..., Any]:
        handler = self.handler
        increment_version = torch.autograd.graph.increment_version

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            def run() -> Any:
                with torch._C._AutoDispatchBelowADInplaceOrView():
                    op.redispatch(keyset & _BELOW, *args, **kwargs)
                increment_version(args[0])
                return args[0]

            return handler(op, args, kwargs, run)

        return kernel
