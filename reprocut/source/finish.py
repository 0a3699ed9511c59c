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


_DEFINITION = (cst.FunctionDef, cst.ClassDef)
_IMPORTS = m.SimpleStatementLine([m.AtLeastN(m.Import() | m.ImportFrom(), n=1)])


def _blank_lines_before(statement: cst.BaseStatement, previous: cst.BaseStatement) -> int:
    """PEP 8's blank lines between two top-level statements (else as many as the code has,
    two at the most)."""
    if isinstance(statement, _DEFINITION) or isinstance(previous, _DEFINITION):
        return 2
    if m.matches(previous, _IMPORTS) and not m.matches(statement, _IMPORTS):
        return 1
    return min(2, sum(line.comment is None for line in statement.leading_lines))


def tidy_layout(code: str) -> str:
    """The code with PEP 8's blank lines between top-level statements (two around functions
    and classes, one after the imports), comments kept: what a reader gets where ruff is
    not installed (passes join pieces with no regard for blank lines)."""
    module = parse(code)
    if module is None:
        return code
    body = list(module.body)
    if body:  # no blank line before the first statement (the passes leave some)
        first = [line for line in body[0].leading_lines if line.comment is not None]
        body[0] = body[0].with_changes(leading_lines=first)
    for i in range(1, len(body)):
        blank = [cst.EmptyLine()] * _blank_lines_before(body[i], body[i - 1])
        comments = [line for line in body[i].leading_lines if line.comment is not None]
        body[i] = body[i].with_changes(leading_lines=[*blank, *comments])
    header = [line for line in module.header if line.comment is not None]
    return module.with_changes(header=header, body=body).code


def format_code(code: str) -> str:
    """ruff-formatted code when ruff is installed, else the code with tidy blank lines."""
    ruff = shutil.which("ruff")
    command = [ruff, "format", "--isolated", "-"] if ruff else None
    if command is None:
        return tidy_layout(code)
    try:
        done = subprocess.run(command, input=code, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return code
    return done.stdout if done.returncode == 0 and done.stdout.strip() else code
