"""Light steps on CPU: torch calls run as they are, and the one that raises is watched again.

A CPU op raises where it fails, so a step needs no tracing of its ops to find the culprit: only
the call that raised must be seen as a full trace sees it. This function mode wraps each public
torch call the script makes in a `try` (the calls inside it run unwatched) and, when one raises
with no culprit noted yet, runs that call once more with the dispatch mode and the public-call
mode on (ops.py, calls.py), so the op that raises again is noted with its inputs, line, step,
module and public call exactly as a full trace notes them. A rerun that does not fail alike
leaves the failure to a rerun of the step (`RunState.raise_missed`).

Two calls are not run again:
- an asserting op's failure the tripwire already noted, when the op works in place
  (`index_add_`, `scatter_add_`): running it again would change what its inputs were; only the
  public call around it is added, as the full trace adds it;
- backward (`loss.backward()`, `torch.autograd.grad`): its graph is freed as it runs. The
  tripwire's culprit stands where it has its forward line; otherwise the step is rerun.

An op called from no public torch call (a TorchScript function, a C++ extension's own Python
binding) raises past the watch: an error of the kinds ops raise, out of a call the watch never
saw, leaves the step to a rerun too (`missed`).
"""

from __future__ import annotations

import dis
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from reprocut.model.publicapi import public_name
from reprocut.record.inside.calls import CallRecorder
from reprocut.record.inside.outcome import EarlyOutcome
from reprocut.record.inside.public import PublicCalls
from reprocut.record.inside.records import Culprit
from reprocut.record.inside.specs import is_cuda_error
from reprocut.record.inside.state import RunState

# calls whose autograd graph is consumed as they run: never run twice
BACKWARD_CALLS = frozenset({torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad})
# what an op's error reaches Python as (c10's errors map to these); a script's own OSError,
# KeyError or AssertionError is none of them
OP_ERRORS = (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError)
_CALL_OPCODES = frozenset(
    dis.opmap[name]
    for name in ("CALL", "CALL_FUNCTION", "CALL_FUNCTION_EX", "CALL_FUNCTION_KW", "CALL_KW")
    if name in dis.opmap
)


class RaiseWatch(TorchFunctionMode):
    """The function mode of a CPU run's light steps: a `try` around each torch call."""

    def __init__(
        self,
        state: RunState,
        calls: CallRecorder,
        public: PublicCalls,
        early: EarlyOutcome,
        watch_every_op: Callable[[bool], None],
    ) -> None:
        super().__init__()
        self.state = state
        self.calls = calls  # the full trace's public-call mode, run by hand for the rerun
        self.public = public
        self.early = early
        self.watch_every_op = watch_every_op  # the dispatch mode on or off (Recorder)
        self.seen: BaseException | None = None  # the last error a watched call raised

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:
            self._raised(func, types, args, kwargs or {}, exc)
            raise

    def _raised(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception
    ) -> None:
        state = self.state
        self.seen = exc
        light = state.light_culprit is exc  # the tripwire noted this failure's culprit
        state.light_culprit = None
        noted, noted_error = state.culprit, state.culprit_error
        if (noted is not None and not light) or is_cuda_error(exc):
            return  # an earlier culprit (an error the script caught) stays, as in a full trace
        if func in BACKWARD_CALLS or (noted is not None and noted.phase == "backward"):
            if noted is None or noted.forward_source is None:
                state.raise_missed = True
            return
        if noted is not None and (noted.op or "").endswith("_"):
            self._add_public_call(noted, func, args, kwargs)
        elif not self._run_again(func, types, args, kwargs, exc):
            state.culprit, state.culprit_error = noted, noted_error  # the tripwire's, if any
            state.raise_missed = noted is None
        elif noted is not None and state.culprit is None:  # cannot be: no op named it again
            state.culprit, state.culprit_error = noted, noted_error
        elif noted is not None:  # its copies are the run's no more (unless shared)
            kept = set(captured_keys(state.culprit.to_json()))
            self.public.store.drop(set(captured_keys(noted.to_json())) - kept)
        if state.culprit is not None and state.culprit_error is not None:
            self.early.report(state.culprit_error)

    def _add_public_call(
        self, culprit: Culprit, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """The public call a full trace names for the op: the one in flight (calls.py); a call
        that is no public API leaves the one found on the stack, as there."""
        name = public_name(func)
        if name is None or name.endswith(("__get__", "__set__")):
            return
        culprit.public_call = name
        culprit.public = self.public.capture(name, args, kwargs).to_json()

    def _run_again(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        exc: Exception,
    ) -> bool:
        """Run the call again under the full watch; True if it raised the same error (the
        culprit is then what the full watch noted, if anything: a property's setter, say, runs
        no op). The script's random state is left as the failure left it."""
        state, early = self.state, self.early
        state.culprit = state.culprit_error = None
        enabled, early.enabled = early.enabled, False  # written once the rerun is known good
        try:
            with torch.random.fork_rng(devices=[]):
                self.watch_every_op(True)
                try:
                    self.calls.__torch_function__(func, types, args, kwargs)
                except Exception as again:
                    return type(again) is type(exc) and str(again) == str(exc)
                finally:
                    self.watch_every_op(False)
            return False
        finally:
            early.enabled = enabled

    def missed(self, exc: BaseException) -> bool:
        """Whether the run's error `exc` may have come from an op this watch never saw: no
        culprit, it never went through a watched call, it is of a kind ops raise, and it came
        out of a call (a TorchScript function, an extension's binding), not a `raise`."""
        state = self.state
        if state.culprit is not None or state.raise_missed:
            return False
        if any(error is self.seen for error in _chain(exc)):
            return False
        return isinstance(exc, OP_ERRORS) and _raised_by_a_call(exc.__traceback__)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the errors it was raised from or while handling (a script may wrap one)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _raised_by_a_call(tb: TracebackType | None) -> bool:
    """The innermost frame of a traceback was calling something when the error came (a C
    function's error), not raising it itself."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] in _CALL_OPCODES


def captured_keys(value: Any) -> list[str]:
    """The store keys a culprit's JSON refers to (`{"captured": key}` at any depth)."""
    if isinstance(value, dict):
        found = [value["captured"]] if isinstance(value.get("captured"), str) else []
        return found + [k for v in value.values() for k in captured_keys(v)]
    if isinstance(value, (list, tuple)):
        return [k for v in value for k in captured_keys(v)]
    return []
