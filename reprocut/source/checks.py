"""How the source reducer's candidates run: as the user's script, by the oracle.

Each candidate is written beside the script (its `__file__`, `sys.path[0]` and the source
`inspect.getsource` reads for `@triton.jit` are the candidate's), one file per slot so that
candidates checked side by side do not overwrite each other, and run as `python script.py
argv...` from `cwd` would run it, in a fork-server child. The server first imports the
script's installed packages (`preload_imports`, reprocut.check.preload), so a check no longer
pays for importing triton, cupy or transformers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reprocut.check.connection import Ticket
from reprocut.check.preload import Preload, PreloadChoice, choose_preloads, uses_dynamo
from reprocut.model.case import Signature
from reprocut.source.validity import sets_environment


def candidate_path(script_path: Path, slot: int = 0) -> Path:
    """Where slot `slot`'s candidates are written: beside the script."""
    tag = "" if slot == 0 else f"{slot}-"
    return script_path.with_name(f".reprocut-candidate-{tag}{script_path.name}")


def preload_imports(
    oracle: Any,
    script_path: Path,
    cwd: Path,
    argv: Sequence[str],
    also: Sequence[Path] = (),
    *,
    defer_dynamo: bool = False,
) -> PreloadChoice:
    """Have the oracle's fork server import the script's installed packages ahead. `also`:
    more folders whose modules are the user's own (never preloaded). `defer_dynamo`: see
    choose_preloads; the choice's `deferred` are for OracleChecks to ask for."""
    dirs = tuple(dict.fromkeys((script_path.parent, cwd, *also)))
    choice = choose_preloads(script_path, dirs, defer_dynamo=defer_dynamo)
    if (choice.preloads or choice.deferred) and getattr(oracle, "fork", False):
        oracle.preload([p.to_json() for p in choice.preloads], filename=str(script_path),
                       cwd=str(cwd), argv=list(argv))  # fmt: skip
    return choice


class OracleChecks:
    """Checks (reprocut.source.speculation) by an Oracle, `slots` candidates at a time."""

    def __init__(
        self,
        oracle: Any,
        script_path: Path,
        *,
        cwd: Path,
        argv: Sequence[str],
        expected: Signature,
        timeout: float,
        slots: int = 1,
        deferred: Sequence[Preload] = (),
    ) -> None:
        self.oracle = oracle
        # imported by the server once a check that uses them is the one the reduction waits on
        # (checks ahead of their turn, and the user's script checked aside, import them in their
        # own child): the cut to the failing call leaves the optimizer behind
        self.deferred = [p.to_json() for p in deferred]
        self._deferring = threading.Lock()
        self.script_path = script_path
        self.cwd = cwd
        self.argv = list(argv)
        self.expected = expected
        self.timeout = timeout
        self.slots = slots
        # one file per slot, one past them for the user's script, checked aside, and one per
        # slot again for the checks begun ahead for later passes (reprocut.source.speculation)
        self.paths = [candidate_path(script_path, k) for k in range(2 * slots + 1)]
        self.search_dirs = tuple(dict.fromkeys((script_path.parent, cwd)))  # the user's modules

    def run(self, code: str, slot: int, ticket: Ticket | None) -> Any:
        path = self.paths[slot]
        path.write_text(code)
        if self.deferred and self._waited_on(slot, ticket) and uses_dynamo(code):
            with self._deferring:
                deferred, self.deferred = self.deferred, []
            if deferred:
                self.oracle.preload_more(deferred)
        return self.oracle.check_source(
            code,
            filename=str(path),
            cwd=self.cwd,
            argv=self.argv,
            timeout=self.timeout,
            sys_path0=str(self.script_path.parent),
            expected=self.expected,
            confirm=False,
            ticket=ticket,
            # a child whose CUDA context was made ahead (the oracle's standbys), unless the
            # candidate may set the environment that start reads
            fresh_child=sets_environment(code, self.search_dirs),
        )

    def _waited_on(self, slot: int, ticket: Ticket | None) -> bool:
        """Is the reduction waiting for this check (not one begun ahead of its turn, nor the
        user's script beside the first candidates: reprocut.source.reducer's slot past these)?"""
        aside = self.slots >= 2 and slot == self.slots
        return not aside and (ticket is None or ticket.ahead == 0)

    def settle(self, code: str, slot: int, verdict: Any) -> Any:
        return self.oracle.confirm_verdict(
            code, str(self.paths[slot]), str(self.cwd), self.argv, verdict, self.expected
        )

    def refused(self, wait: bool = False) -> str | None:
        """A candidate accepted earlier that the oracle's plain confirmation, beside the
        reduction, refused since (reprocut.check.agreement), if it confirms so."""
        hook = getattr(getattr(self.oracle, "confirm", None), "refused", None)
        return hook(wait) if hook is not None else None

    def close(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)
