"""`optimizer.step()` as the recorder's optimizer hooks see it (recorder.py).

A step's optimizer call ends the step; what runs inside it is torch's, except a closure the
user handed in (Lightning runs `training_step` there, LBFGS calls it repeatedly), which runs as
the user's code. torch's own optimizers are told apart from the user's: on CPU their step runs
without the raise watch (raise_watch.py), the user's closure and the user's optimizers with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reprocut.record.inside.state import RunState


def from_torch(optimizer: Any) -> bool:
    """One of torch's optimizers, not the user's own (whose code may be where it fails)."""
    return type(optimizer).__module__.startswith("torch.")


def closure_outside_optimizer(
    state: RunState, args: Any, kwargs: Any, watch: Callable[[bool], None] | None = None
) -> Any:
    """`optimizer.step(closure)` with the closure run as the user's code: Lightning runs
    `training_step` (forward and backward) inside the closure, and LBFGS calls it repeatedly.
    Returns the hook's replacement (args, kwargs), or None when there is no closure. `args`
    holds the optimizer itself first. `watch`, if given, turns the raise watch on for the
    closure and off after it (left on if the closure raises: the failure was watched)."""
    if kwargs.get("closure") is not None:
        closure = kwargs["closure"]
    elif len(args) > 1 and callable(args[1]):
        closure = args[1]
    else:
        return None

    def run_closure(*closure_args: Any, **closure_kwargs: Any) -> Any:
        depth, state.in_optimizer = state.in_optimizer, 0
        if watch is not None:
            watch(True)
        try:
            result = closure(*closure_args, **closure_kwargs)
        finally:
            state.in_optimizer = depth
        if watch is not None:
            watch(False)
        return result

    if kwargs.get("closure") is not None:
        return args, {**kwargs, "closure": run_closure}
    return (args[0], run_closure, *args[2:]), kwargs
