"""What `reprocut record` runs, parsed as `python` would parse it: a script or `-m` module.

Three spellings run the same thing, and the script sees the `sys.argv` plain `python` gives it
(argv[0] as typed for a script, the module's file for `-m`; a later `--` passed through):

    reprocut record [options] train.py ARGS...
    reprocut record [options] -m pkg.train ARGS...
    reprocut record [options] -- [python [PYTHON-OPTIONS]] (-m pkg.train | train.py) ARGS...

and after `--` a torchrun command (`torchrun [OPTIONS] (train.py | -m pkg.train) ARGS...`, or
`python -m torch.distributed.run ...`), whose every rank runs the Launch as torchrun runs it
(`python -u ...`); the launcher's own part is `Launch.torchrun` (record/ranks/torchrun.py reads it).
`-- pytest ARGS` (or `py.test`) runs pytest as `python -m pytest ARGS` does, which is what its
console script runs.

`split_command` cuts reprocut's own options from the launch command before argparse sees it
(argparse would take `-m` and the script's options for its own); `parse_launch` turns the launch
command into a Launch; `locate` finds the file that will run as `__main__`.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprocut.model.errors import ScriptNotFoundError
from reprocut.model.launch import Launch, LaunchError

# Interpreter options accepted after `-- python`, passed on to the child's interpreter. Those
# that would change how reprocut itself starts (-E and -I ignore PYTHONPATH, -c and -i run no
# file) are refused.
PYTHON_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-s", "-b", "-bb", "-q", "-v", "-d", "-R"})
PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X"})
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?(\.exe)?$")
PYTEST_COMMANDS = frozenset({"pytest", "py.test"})
TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})


def split_command(
    args: Sequence[str], value_options: Collection[str]
) -> tuple[list[str], list[str]]:
    """(reprocut's options, the launch command): the launch starts at `--`, at `-m`, or at the
    first argument that is neither an option nor an option's value. `value_options` are the
    option strings that take a value; a unique prefix of one counts (argparse allows them)."""
    index = 0
    while index < len(args):
        token = args[index]
        if token == "--" or token.startswith("-m") or not token.startswith("-") or token == "-":
            return list(args[:index]), list(args[index:])
        if "=" not in token and _takes_value(token, value_options):
            index += 1  # its value, whatever it looks like
        index += 1
    return list(args), []


def _takes_value(token: str, value_options: Collection[str]) -> bool:
    if token in value_options:
        return True
    if not token.startswith("--"):
        return False
    matches = [option for option in value_options if option.startswith(token)]
    return len(matches) == 1


def parse_launch(tokens: Sequence[str]) -> Launch:
    """The launch command as split off by `split_command`."""
    tokens = list(tokens)
    if tokens and tokens[0] == "--":
        return parse_command(tokens[1:])
    return _parse_target(tokens, ())


def parse_command(tokens: list[str]) -> Launch:
    """A command after `--`: `python [options] (-m MODULE | SCRIPT) ARGS`, a torchrun command,
    or the target alone."""
    launcher = torchrun_prefix(tokens)
    if launcher:
        from reprocut.record.ranks.torchrun import parse_torchrun  # torchrun's parser imports torch

        return parse_torchrun(tokens[:launcher], tokens[launcher:])
    if tokens and os.path.basename(tokens[0]) in PYTEST_COMMANDS:
        return Launch(module="pytest", args=tuple(tokens[1:]))
    if tokens and is_python(tokens[0]):
        return _parse_python(tokens[1:])
    return _parse_target(tokens, ())


def torchrun_prefix(tokens: Sequence[str]) -> int:
    """How many tokens name the launcher: 1 for `torchrun`, more for `python [options] -m
    torch.distributed.run` (or the legacy launch module, which parse_torchrun refuses); 0 for a
    command that is not a torchrun."""
    if not tokens:
        return 0
    if os.path.basename(tokens[0]) == "torchrun":
        return 1
    if not is_python(tokens[0]):
        return 0
    _, used = _python_options(list(tokens[1:]))
    rest = tokens[1 + used :]
    if not rest or not rest[0].startswith("-m"):
        return 0
    module, width = (rest[0][2:], 1) if rest[0][2:] else (rest[1] if len(rest) > 1 else "", 2)
    return 1 + used + width if module in TORCHRUN_MODULES else 0


def is_python(token: str) -> bool:
    """`python`, `python3`, `python3.11`, a path to one, or this interpreter."""
    if os.path.basename(token) and _PYTHON_NAME.match(os.path.basename(token)):
        return True
    return bool(sys.executable) and os.path.abspath(token) == os.path.abspath(sys.executable)


def _parse_python(tokens: list[str]) -> Launch:
    options, used = _python_options(tokens)
    return _parse_target(tokens[used:], options)


def _python_options(tokens: list[str]) -> tuple[tuple[str, ...], int]:
    """The interpreter options at the start of `tokens`, and how many tokens they take."""
    options: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("-m") or not token.startswith("-") or token == "-":
            break
        if token in PYTHON_FLAGS:
            options.append(token)
        elif token in PYTHON_VALUE_OPTIONS:
            if index + 1 >= len(tokens):
                raise LaunchError(f"python option {token} needs a value")
            options += [token, tokens[index + 1]]
            index += 1
        elif token[:2] in PYTHON_VALUE_OPTIONS:  # -Wignore, -Xdev
            options.append(token)
        else:
            raise LaunchError(
                f"python option {token} is not supported under `reprocut record`",
                hint="reprocut runs a script or a module (-m); supported interpreter options: "
                + ", ".join(sorted(PYTHON_FLAGS | PYTHON_VALUE_OPTIONS)),
            )
        index += 1
    return tuple(options), index


def _parse_target(tokens: list[str], python_options: tuple[str, ...]) -> Launch:
    if not tokens:
        raise LaunchError(
            "no script to run",
            hint="reprocut record train.py ARGS, reprocut record -m pkg.train ARGS, "
            "or reprocut record -- python train.py ARGS",
        )
    first = tokens[0]
    if first.startswith("-m"):
        module = first[2:] or (tokens[1] if len(tokens) > 1 else "")
        rest = tokens[1:] if first[2:] else tokens[2:]
        if not module:
            raise LaunchError("-m needs a module name", hint="reprocut record -m pkg.train ARGS")
        return Launch(module=module, args=tuple(rest), python_options=python_options)
    if first.startswith("-"):
        raise LaunchError(
            f"expected a script or -m MODULE, got {first}",
            hint="reprocut's own options go before the script; after `--` comes a python command",
        )
    return Launch(
        script=Path(first), args=tuple(tokens[1:]), argv0=first, python_options=python_options
    )


def locate(launch: Launch, cwd: Path) -> Launch:
    """The launch with the file that runs as `__main__` found, as python would find it."""
    if launch.module is None:
        assert launch.script is not None
        script = launch.script if launch.script.is_absolute() else cwd / launch.script
        if not script.exists():
            raise ScriptNotFoundError(f"no such script: {launch.script}", hint="check the path")
        if not script.is_file():
            raise ScriptNotFoundError(f"{launch.script} is not a file")
        return replace(launch, script=script.resolve())
    origin = module_file(launch.module, cwd)
    if origin is None:
        raise ScriptNotFoundError(
            f"no module named {launch.module}",
            hint="run from the folder that holds the package (python -m finds it from the "
            "working directory and PYTHONPATH)",
        )
    return replace(launch, script=Path(origin), argv0=origin)


def module_file(name: str, cwd: Path) -> str | None:
    """The file `python -m name` runs (a package's `__main__.py`), found without importing
    anything: importing the user's packages here would run their code in reprocut's process."""
    locations: list[str] = [str(cwd), *_pythonpath(), *sys.path[1:]]
    spec = None
    parts = name.split(".")
    for depth, part in enumerate(parts):
        spec = _find_spec(".".join(parts[: depth + 1]), locations, top=depth == 0)
        if spec is None:
            return None
        if spec.submodule_search_locations is None:
            if depth < len(parts) - 1:
                return None  # a module, not a package: nothing below it
            break
        locations = _search_locations(spec, [os.path.join(loc, part) for loc in locations])
    else:  # a package: python -m runs its __main__
        spec = _find_spec(f"{name}.__main__", locations, top=False)
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return os.path.abspath(spec.origin)


def _search_locations(spec: importlib.machinery.ModuleSpec, guess: list[str]) -> list[str]:
    """Where a package's submodules are (for a namespace package found by another finder,
    whose path is computed from its parent in sys.modules: the parent's folders plus its name)."""
    try:
        return list(spec.submodule_search_locations or ())
    except Exception:
        return [folder for folder in guess if os.path.isdir(folder)]


def _find_spec(
    name: str, locations: list[str], *, top: bool
) -> importlib.machinery.ModuleSpec | None:
    """Like PathFinder.find_spec over `locations`, with the path hooks python uses, but a
    namespace package's folders are kept as a plain list (PathFinder would read its parent
    package from sys.modules)."""
    portions: list[str] = []
    for location in locations:
        finder = _path_entry_finder(location)
        spec = None if finder is None else finder.find_spec(name)
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions.extend(spec.submodule_search_locations or ())
    if portions:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = portions
        return spec
    if not top:
        return None
    for finder in sys.meta_path:  # editable installs register finders of their own
        if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(name, None)
        except Exception:
            continue
        if spec is not None and spec.origin not in (None, "built-in", "frozen"):
            return spec
    return None


def _path_entry_finder(location: str) -> Any:
    for hook in sys.path_hooks:
        try:
            return hook(location)
        except ImportError:
            continue
    return None


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
