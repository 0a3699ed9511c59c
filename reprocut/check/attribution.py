"""Which op raised? A dispatch mode and a function mode that remember the culprit of an exception.

The oracle's children run every candidate under `FaultAttribution` so that a verdict names the
aten op that raised (`aten::embedding`) and the outermost public call the code made
(`torch.nn.functional.one_hot`): composite ops such as one_hot raise outside any aten op on CPU.
With `sync=True` a device fault raises at the op that launched it, not at a later call.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from reprocut.model.case import Signature
from reprocut.model.publicapi import aten_name, public_name
from reprocut.model.signature import classify


def _touches_cuda(values: Any) -> bool:
    return any(
        isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"
        for leaf in tree_leaves(values)
    )


class _OpMode(TorchDispatchMode):
    """Notes the first aten op that raises; optionally synchronizes after ops on CUDA tensors."""

    def __init__(self, owner: FaultAttribution) -> None:
        super().__init__()
        self.owner = owner

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No dynamo-disabling wrapper: its first call imports torch._dynamo (2 s and more), which
        every fork server paid at start before it could answer its first check."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
            if self.owner.sync and (_touches_cuda(args) or _touches_cuda(kwargs)):
                torch.cuda.synchronize()
            return out
        except BaseException:
            if self.owner.op is None:
                self.owner.op = aten_name(func)
            raise


class _CallMode(TorchFunctionMode):
    """Notes the outermost public torch call that raised (nested calls do not re-enter a mode)."""

    def __init__(self, owner: FaultAttribution) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return func(*args, **(kwargs or {}))
        except BaseException:
            if self.owner.public_call is None:
                self.owner.public_call = public_name(func)
            raise


class FaultAttribution:
    """Context manager: after an exception, `.op` and `.public_call` name where it came from."""

    def __init__(self, *, sync: bool = False) -> None:
        self.sync = sync
        self.op: str | None = None
        self.public_call: str | None = None
        self._modes: list[Any] = []

    def __enter__(self) -> FaultAttribution:
        self._modes = [_CallMode(self), _OpMode(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(exc_type, exc, tb)
        self._modes = []

    @property
    def culprit(self) -> str | None:
        """The Signature.op rule: the aten op that raised, else the public call that raised."""
        return self.op or self.public_call


@dataclass(frozen=True, slots=True)
class RaisedError:
    """An exception reduced to plain data (it crosses a process boundary as JSON)."""

    type: str
    message: str
    error_code: int | None = None
    op: str | None = None
    public_call: str | None = None

    @classmethod
    def from_exception(
        cls, exc: BaseException, attribution: FaultAttribution | None = None
    ) -> RaisedError:
        code = getattr(exc, "error_code", None)
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            error_code=code if isinstance(code, int) else None,
            op=attribution.op if attribution else None,
            public_call=attribution.public_call if attribution else None,
        )

    def signature(self, stderr: str = "") -> Signature:
        return classify(
            self.type, self.message, stderr, self.op or self.public_call, self.error_code
        )


def signature_of(
    exc: BaseException, stderr: str = "", attribution: FaultAttribution | None = None
) -> Signature:
    """The Signature of an exception raised under `attribution`, with the process's stderr."""
    return RaisedError.from_exception(exc, attribution).signature(stderr)


def settle_cuda() -> None:
    """Wait for the GPU work queued so far. A script that never synchronizes (no `.item()`, no
    print of a tensor) can end before its faulting kernel runs, and a plain run then exits 0 or
    dies at teardown; waiting at its end turns that fault into the failure it is."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
