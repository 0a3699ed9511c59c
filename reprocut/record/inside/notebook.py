"""Run a notebook's code cells in order in this process, as Jupyter's "Run All" would.

All cells share one `__main__` namespace, and the run stops at the first cell that raises, as
Run All does. Each cell is compiled under its own name (model/notebook.py: `cell_filename`) and
its code put into linecache, so frames, tracebacks and the loop counters read the cell's lines.
IPython magics and shell lines (model/cell_code.py) reach `run_magic`: through IPython's shell
where IPython is installed, else skipped with a note on stderr. A magic never ends the run.
"""

from __future__ import annotations

import builtins
import linecache
import sys
import types
from typing import Any

from reprocut.model.cell_code import MAGIC_CALL, translate_cell
from reprocut.model.notebook import cell_filename, code_cells

_shell: Any = None


def run_notebook(path: str) -> None:
    """Run the notebook at `path` (absolute) as __main__; sys.argv and sys.path are the
    caller's to set."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    setattr(main, MAGIC_CALL, run_magic)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        for cell in code_cells(path):
            filename = cell_filename(path, cell.index)
            source = translate_cell(cell.source).code
            lines = source.splitlines(keepends=True)
            linecache.cache[filename] = (len(source), None, lines, filename)
            exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def run_magic(kind: str, name: str, text: str, body: str | None = None) -> Any:
    """A magic or shell line of a cell: `kind` is "line", "cell", "shell" (`!cmd`) or
    "getoutput" (`x = !cmd`)."""
    shown = _shown(kind, name, text)
    shell = _ipython_shell()
    if shell is None:
        if kind == "cell" and name == "writefile":  # cells that write a module used later
            return _write_file(text, body or "")
        _note(f"skipped `{shown}` (IPython is not installed)")
        return None
    try:
        if kind == "line":
            return shell.run_line_magic(name, text)
        if kind == "cell":
            return shell.run_cell_magic(name, text, body or "")
        if kind == "getoutput":
            return shell.getoutput(text)
        return shell.system(text)
    except BaseException as exc:
        _note(f"`{shown}` failed under IPython and was skipped: {type(exc).__name__}: {exc}")
        return None


def _ipython_shell() -> Any:
    global _shell
    if _shell is None:
        try:
            from IPython.core.interactiveshell import InteractiveShell
        except ImportError:
            _shell = False
        else:
            try:
                main = sys.modules["__main__"]
                _shell = InteractiveShell.instance(user_module=main, user_ns=main.__dict__)
            except Exception as exc:
                _note(f"IPython's shell did not start ({exc}): magics are skipped")
                _shell = False
    return _shell or None


def _write_file(text: str, body: str) -> None:
    words = text.split()
    append = "-a" in words or "--append" in words
    names = [word for word in words if not word.startswith("-")]
    if not names:
        _note("skipped `%%writefile` without a file name")
        return
    with open(names[0], "a" if append else "w", encoding="utf-8") as out:
        out.write(body)


def _shown(kind: str, name: str, text: str) -> str:
    if kind in ("shell", "getoutput"):
        return f"!{text}"
    sigil = "%%" if kind == "cell" else "%"
    return f"{sigil}{name} {text}".rstrip()


def _note(message: str) -> None:
    print(f"reprocut: notebook: {message}", file=sys.stderr, flush=True)
