"""The user's installed packages, imported once in the fork server instead of in every check.

Every candidate of a source reduction imports what the script imports before it reaches the
failing call: triton, cupy, transformers cost a second or more each, paid again by every check.
`choose_preloads` reads the script (and the sibling modules it imports) in reading order and
picks the imports the server may run for its children: installed packages only (found in
site-packages and not shadowed by a file of the user's), never the user's own modules, nothing
after the script writes the environment (a package may read it at import), no module known to
make a CUDA context when imported. `preload_here` runs in the server: a forked trial child
imports them first and refuses any that initialise CUDA (torch's lazy init, or the driver's:
/dev/nvidia-uvm opened) or start a thread (a fork keeps only the forking thread), while the
server imports the trusted ones beside it; the server then imports the rest, as the script
would (`from m import a, b` resolves `a` and `b`, which is what makes a lazy package such as
transformers load its real modules).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALREADY = frozenset({"torch", "__future__", "reprocut"})  # the server has them, or never wants them
CUDA_AT_IMPORT = frozenset({"pycuda.autoinit"})  # modules that make a CUDA context when imported
TRIAL_TIMEOUT = 120.0
ENVIRON_WRITERS = frozenset({"update", "setdefault", "pop", "clear", "putenv", "unsetenv"})
# torch's parts whose first use imports torch._dynamo (a second on the 2-core CPU machine, paid by
# every check of a script that registers a custom op or steps an optimizer): the server, which
# leaves it out at its own start, imports it for such a script's checks
DYNAMO_USERS = ("torch.library", "torch.optim", "torch.compile", "torch._dynamo", "torch.export")


@dataclass(frozen=True, slots=True)
class Preload:
    """One import statement for the server to run: `import module` or `from module import names`."""

    module: str
    names: tuple[str, ...] = ()

    def to_json(self) -> list[Any]:
        return [self.module, list(self.names)]


DYNAMO = Preload("torch._dynamo")
# imported without a trial: every trial so far found them safe (no CUDA context, no thread), on
# the H200 and on CPU, and a custom op's checks wait for them (the trial import of triton and
# torch._dynamo took seconds of a triton_op's first check with four shrinks on the H200; cupy's
# trial, then its import, 7.2-9.5 s of a CuPy script's first check beside three other shrinks,
# where it was found safe in every H200 call). The server's own check after the imports
# (`_spoiled`) still refuses to fork if one ever is not.
TRUSTED = frozenset({"torch._dynamo", "triton", "triton.language", "numpy", "cupy"})


@dataclass(frozen=True, slots=True)
class PreloadChoice:
    preloads: tuple[Preload, ...]
    skipped: tuple[tuple[str, str], ...]  # (module, why it is not preloaded)
    # imported once a check that needs them is the one the reduction waits on (`defer_dynamo`)
    deferred: tuple[Preload, ...] = ()

    def modules(self) -> tuple[str, ...]:
        return tuple(p.module for p in self.preloads)


# --- choosing (reprocut's side) ----------------------------------------------------------------


def choose_preloads(
    script: Path, search_dirs: Sequence[Path], *, defer_dynamo: bool = False
) -> PreloadChoice:
    """The imports of `script` and of the user's modules it imports, as the server may run them.

    `defer_dynamo`: torch._dynamo goes to `deferred` when only the script itself uses it (its
    optimizer, say), not a module of the user's it imports. A script reduction's cut to the
    failing call keeps the definitions and the failing function, not the training set-up: on the
    H200 the server's import of torch._dynamo (about 5 s with four shrinks at once) was paid
    before the first check of every CuPy and Triton script, whose candidates never used it."""
    chooser = _Chooser(tuple(Path(d).resolve() for d in search_dirs))
    top = Path(script).resolve()
    chooser.read(top)
    preloads = tuple(dict.fromkeys(chooser.preloads))
    if defer_dynamo and DYNAMO in preloads and chooser.dynamo_files == {top}:
        deferred = (DYNAMO,)
        preloads = tuple(p for p in preloads if p != DYNAMO)
    else:
        deferred = ()
    return PreloadChoice(preloads, tuple(chooser.skipped), deferred)


def uses_dynamo(code: str) -> bool:
    """Does `code` name a part of torch that imports torch._dynamo when used (DYNAMO_USERS)? A
    name in a comment or a string counts too: then the import comes early, which is safe."""
    return any(name in code for name in DYNAMO_USERS)


class _Chooser:
    def __init__(self, search_dirs: tuple[Path, ...]) -> None:
        self.search_dirs = search_dirs
        self.preloads: list[Preload] = []
        self.skipped: list[tuple[str, str]] = []
        self.read_files: set[Path] = set()
        self.environ_written: str | None = None  # where the environment was first written
        self.dynamo_files: set[Path] = set()  # the files that use a part of torch using it

    def read(self, path: Path) -> None:
        if path in self.read_files:
            return
        self.read_files.add(path)
        try:
            tree = ast.parse(path.read_text(), str(path))
        except (OSError, SyntaxError, ValueError):
            return
        for node in _in_reading_order(tree):
            if self.environ_written is None and _writes_environ(node):
                self.environ_written = f"{path.name}:{getattr(node, 'lineno', '?')}"
            elif self.environ_written is None and _uses_dynamo(node):
                self.preloads.append(DYNAMO)  # (torch._dynamo reads the environment at import)
                self.dynamo_files.add(path)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.consider(alias.name, ())
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.level:  # a relative import: the user's own package
                    self.skipped.append((node.module, "the user's own package"))
                    continue
                names = tuple(a.name for a in node.names if a.name != "*")
                self.consider(node.module, names)

    def consider(self, module: str, names: tuple[str, ...]) -> None:
        top = module.split(".")[0]
        own = _own_file(top, self.search_dirs)
        if own is not None:
            self.read(own)  # the user's module: what it imports counts, it does not
            self.skipped.append((module, "the user's own module"))
        elif top in ALREADY or top in sys.stdlib_module_names:
            return
        elif self.environ_written is not None:
            self.skipped.append((module, f"imported after the environment is written at "
                                         f"{self.environ_written}"))  # fmt: skip
        elif module in CUDA_AT_IMPORT or module.endswith(".autoinit"):
            self.skipped.append((module, "makes a CUDA context when imported"))
        elif not _installed(top):
            self.skipped.append((module, "not an installed package"))
        else:
            self.preloads.append(Preload(module, names))


def _in_reading_order(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, each statement before what comes after it in the file."""
    for node in ast.iter_child_nodes(tree):
        yield node
        yield from _in_reading_order(node)


def _uses_dynamo(node: ast.AST) -> bool:
    """`torch.optim.SGD`, `@torch.library.custom_op(...)`, `torch.compile(...)`: a use of a
    part of torch that imports torch._dynamo when first used."""
    if not isinstance(node, ast.Attribute):
        return False
    try:
        dotted = ast.unparse(node)
    except (ValueError, RecursionError):
        return False
    return any(dotted == name or dotted.startswith(name + ".") for name in DYNAMO_USERS)


def _writes_environ(node: ast.AST) -> bool:
    """`os.environ[k] = v`, `os.environ.update(...)`, `os.putenv(...)` and the like."""
    if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
        return any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        func = node.func
        if func.attr in ENVIRON_WRITERS and _is_environ(func.value):
            return True
        return func.attr in {"putenv", "unsetenv"} and _is_name(func.value, "os")
    return False


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or _is_name(node, "environ")


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _own_file(top: str, search_dirs: tuple[Path, ...]) -> Path | None:
    """The user's module or package named `top`: beside the script, in the working directory,
    or one folder down (a `vendor/` put on sys.path). Such a name is never preloaded, even when
    an installed package has it too (the user's file wins in their run)."""
    folders = [d for base in search_dirs for d in (base, *_subfolders(base))]
    for folder in folders:
        if (folder / f"{top}.py").is_file():
            return folder / f"{top}.py"
        if (folder / top / "__init__.py").is_file():
            return folder / top / "__init__.py"
        if (folder / top).is_dir() or any(folder.glob(f"{top}.*.so")):
            return folder / top  # a namespace package or an extension: not readable, still own
    return None


def _subfolders(base: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return [p for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))]
    return []


def _site_dirs() -> tuple[Path, ...]:
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    with contextlib.suppress(AttributeError):
        paths.update(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        paths.add(site.getusersitepackages())
    return tuple(Path(p).resolve() for p in paths)


def _installed(top: str) -> bool:
    """Found (without importing it) in a site-packages folder of this interpreter."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.origin else []
    places += list(spec.submodule_search_locations or [])
    sites = _site_dirs()
    return bool(places) and all(
        any(Path(p).resolve().is_relative_to(s) for s in sites) for p in places if p
    )


# --- importing (the fork server's side) --------------------------------------------------------


def preload_here(request: dict[str, Any]) -> dict[str, Any]:
    """Import the request's preloads in this process (the fork server), each only if a trial
    import in a forked child found it safe (the TRUSTED ones without a trial). The reply: what
    was loaded, what was refused and why."""
    started = time.perf_counter()
    preloads = [Preload(m, tuple(names)) for m, names in request["preload"]]
    trusted = [p for p in preloads if p.module in TRUSTED]  # no trial: `_spoiled` still checks
    pending = [p for p in preloads if p.module not in TRUSTED]
    # forked before the server imports anything more, so the trial child imports beside it
    first = _Trial(pending, request) if pending else None
    with _as_the_script(request):
        before = _state()
        for preload in trusted:
            _import(preload)
        safe, refused = _tried(first, pending, request)
        for preload in safe:
            _import(preload)
        spoiled = _spoiled(before)
    safe = trusted + safe
    return {
        "outcome": "preloaded",
        "loaded": [p.module for p in safe],
        "refused": refused,
        "unsafe": spoiled,  # set: this server must not fork any more (never seen so far)
        "seconds": time.perf_counter() - started,
    }


@contextlib.contextmanager
def _as_the_script(request: dict[str, Any]) -> Iterator[None]:
    """Import as the script would: its folder first on sys.path, its cwd and argv."""
    saved = (os.getcwd(), sys.path[0], list(sys.argv))
    try:
        with contextlib.suppress(OSError):
            os.chdir(request.get("cwd") or saved[0])
        sys.path[0] = request.get("sys_path0") or sys.path[0]
        sys.argv = [request.get("filename") or "", *request.get("argv", [])]
        yield
    finally:
        with contextlib.suppress(OSError):
            os.chdir(saved[0])
        sys.path[0], sys.argv = saved[1], saved[2]


def _import(preload: Preload) -> None:
    module = importlib.import_module(preload.module)
    for name in preload.names:  # as `from module import name` does: an attribute or a submodule
        if not hasattr(module, name):
            importlib.import_module(f"{preload.module}.{name}")
        getattr(module, name)


def _state() -> tuple[int, frozenset[str]]:
    return threading.active_count(), _gpu_files()


def _gpu_files() -> frozenset[str]:
    """The NVIDIA device files this process holds open (the driver's, once CUDA is initialised)."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target == "/dev/nvidia-uvm" or target[len("/dev/nvidia") :].isdigit():
                    found.add(target)
    return frozenset(found)


def _spoiled(before: tuple[int, frozenset[str]]) -> str | None:
    """Why a fork after the imports since `before` would not be like a fresh process, if so."""
    threads, files = _state()
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        return "initialised CUDA"
    if files - before[1]:
        return f"opened {', '.join(sorted(files - before[1]))} (CUDA initialised by the driver)"
    if threads > before[0]:
        return "started a thread"
    return None


def _tried(
    first: _Trial | None, preloads: list[Preload], request: dict[str, Any]
) -> tuple[list[Preload], dict[str, str]]:
    """The preloads a trial found safe, in order, and why the others were refused: after a
    refusal the trial child is spoiled, so the rest are tried in another (`first`: the trial
    of all of them, already started)."""
    safe: list[Preload] = []
    refused: dict[str, str] = {}
    trial = first
    while preloads:
        verdicts = (trial or _Trial(preloads, request)).verdicts()
        trial = None
        rest: list[Preload] = []
        for k, preload in enumerate(preloads):
            why = verdicts.get(preload.module, "the trial import did not finish")
            if why != "ok":
                refused[preload.module] = why
                rest = preloads[k + 1 :]  # the trial child is spoiled past this one: again
                break
            safe.append(preload)
        preloads = rest
    return safe, refused


class _Trial:
    """`preloads` imported in order in a child forked now; per module "ok" or why not, up to
    the first that is not (the child is spoiled past it)."""

    def __init__(self, preloads: list[Preload], request: dict[str, Any]) -> None:
        from reprocut.check.forkchild import flush_streams

        read_fd, write_fd = os.pipe()
        flush_streams()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                os.setpgid(0, 0)
                with os.fdopen(write_fd, "w") as pipe, _as_the_script(request):
                    for preload in preloads:
                        before = _state()
                        try:
                            _import(preload)
                            why = _spoiled(before) or "ok"
                        except BaseException as exc:  # an import error: the script's run would say
                            why = f"import failed: {type(exc).__name__}"
                        pipe.write(json.dumps([preload.module, why]) + "\n")
                        pipe.flush()
                        if why != "ok":
                            break
            finally:
                os._exit(0)
        os.close(write_fd)
        self.pid, self.read_fd = pid, read_fd
        self.deadline = time.monotonic() + TRIAL_TIMEOUT

    def verdicts(self) -> dict[str, str]:
        """Wait for the child's verdicts (until TRIAL_TIMEOUT from its start), then end it."""
        from reprocut.check.forkchild import kill_group

        verdicts: dict[str, str] = {}
        with os.fdopen(self.read_fd) as pipe:
            os.set_blocking(self.read_fd, True)
            import select

            while time.monotonic() < self.deadline:
                ready, _, _ = select.select([pipe], [], [], self.deadline - time.monotonic())
                line = pipe.readline() if ready else ""
                if not line:
                    break
                module, why = json.loads(line)
                verdicts[module] = why
        kill_group(self.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        return verdicts
