"""Run the user's script or module as `__main__`, exactly as `python` would, in this process.

`runpy.run_path` sets `sys.argv[0]` to the path it was given and `__package__` to "", where
`python train.py` leaves argv[0] as typed and `__package__` None; scripts that read
`sys.argv[0]` (argparse's `prog`, paths next to it) would see a difference. So a script is
compiled and run here in a fresh `__main__` module; a module (`-m`) goes through
`runpy.run_module`, which is what `python -m` does (argv[0] becomes the module's file). A
notebook (`.ipynb`) runs its code cells in order (notebook.py), and pytest runs with reprocut's
plugin that notes the first test failing in a torch op (pytest_watch.py).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import runpy
import sys
import types
from typing import TYPE_CHECKING

from reprocut.model.notebook import is_notebook

if TYPE_CHECKING:
    from reprocut.record.inside.state import RunState


def run_main(script: str, module: str | None = None, state: RunState | None = None) -> None:
    """Run `module` (as `python -m`) or else the file `script` (an absolute path) as __main__;
    sys.argv and sys.path are the caller's to set. `state`: the recorder's, for pytest's watch."""
    if module == "pytest" and state is not None:
        from reprocut.record.inside.pytest_watch import run_pytest

        run_pytest(state)
        return
    if module:
        runpy.run_module(module, {"__builtins__": builtins}, run_name="__main__", alter_sys=True)
        return
    if is_notebook(script):
        from reprocut.record.inside.notebook import run_notebook

        run_notebook(script)
        return
    with io.open_code(script) as source:
        code = compile(source.read(), script, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__builtins__ = builtins  # type: ignore[attr-defined]  # the module, as python's __main__
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
