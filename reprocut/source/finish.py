"""What the source reducer does to its result last: wait for the GPU at the end, format it.

Each is kept only if the script still fails the same way afterwards (the reducer checks).
"""

from __future__ import annotations

import shutil
import subprocess

import libcst as cst
import libcst.matchers as m

from reprocut.source.passes import parse


def ending_with_a_sync(code: str) -> str:
    """A GPU repro ends by waiting for the GPU: a fault still queued when `python repro.py`
    ends surfaces only at teardown (CuPy's module unload, say) with exit status 0, or not at
    all. The code as it is when it uses no GPU or already waits."""
    if "cuda" not in code or "torch.cuda.synchronize()" in code:
        return code
    module = parse(code)
    if module is None:
        return code
    wait = cst.parse_statement("torch.cuda.synchronize()\n")
    body = [*module.body, wait]
    if not any(m.matches(s, m.SimpleStatementLine([m.Import([m.ImportAlias(m.Name("torch"))])]))
               for s in module.body):  # fmt: skip
        future = sum(1 for s in module.body if m.matches(s, m.SimpleStatementLine(
            [m.ImportFrom(module=m.Name("__future__"))])))  # fmt: skip
        body.insert(future, cst.parse_statement("import torch\n"))
    return module.with_changes(body=body).code


def format_code(code: str) -> str:
    """ruff-formatted code when ruff is installed, else the code as it is."""
    ruff = shutil.which("ruff")
    command = [ruff, "format", "--isolated", "-"] if ruff else None
    if command is None:
        return code
    try:
        done = subprocess.run(command, input=code, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return code
    return done.stdout if done.returncode == 0 and done.stdout.strip() else code
