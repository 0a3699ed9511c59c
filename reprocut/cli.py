"""`reprocut` command line: argv -> subcommand -> ExitCode. No logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from reprocut import __version__, silence_torch_import_warnings
from reprocut.check import check_log, early_server, extension_locks
from reprocut.model.errors import ExitCode, ReprocutError

COMMANDS = {
    "record": (
        "reprocut.commands.record",
        "run a script, find the first op that faults, capture its inputs",
    ),
    "shrink": (
        "reprocut.commands.shrink",
        "turn the latest recording with a failure into a minimal, verified repro.py",
    ),
    "sanitize": (
        "reprocut.commands.sanitize",
        "run a recording's repro.py under compute-sanitizer memcheck",
    ),
    "runs": (
        "reprocut.commands.runs",
        "list the recordings, or delete old ones (--clean)",
    ),
}

# the commands whose processes reprocut may kill mid-way (see check/extension_locks.py)
KILLING = frozenset({"record", "shrink", "sanitize"})

EPILOG = """\
exit codes:
  0  recorded and localized / repro written and verified
  1  nothing to reproduce (the script passed, or the repro lost the signature)
  2  interrupted
  3  internal error in reprocut
  4  usage error: bad arguments, missing script, missing or corrupt recording
  5  the script failed, but not in a torch op (syntax error, plain Python error)
  6  timeout (the script hung or ran past --timeout)
  7  the failure was seen but could not be localized to an op
  8  the repro fails only some of the time
  9  out of memory only because other memory was held: no op-level repro (see the memory report)

typical use:
  reprocut record train.py --epochs 3
  reprocut shrink
  python .reprocut/runs/<id>/repro.py
  reprocut runs --clean --keep 5
  reprocut sanitize            (memory faults: which access, thread and tensor)
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (shrink's pulls in libcst: half a second
    that `record` would pay before the user's script even starts). None imports them all."""
    parser = argparse.ArgumentParser(
        prog="reprocut",
        description="Turn a PyTorch script that dies with a CUDA error into a minimal repro.py.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"reprocut {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_text)  # listed in --help, never parsed
            continue
        module = importlib.import_module(module_name)
        subparser = sub.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(subparser)
        subparser.set_defaults(module=module)
    return parser


def error_json(exc: ReprocutError) -> dict[str, object]:
    return {
        "status": exc.slug,
        "message": str(exc),
        "hint": exc.hint,
        "exit_code": int(exc.exit_code),
    }


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """argv as a Namespace. A command that runs a program (record) first cuts that program's
    command line off (`split_args`): argparse would read its `-m` and options as reprocut's."""
    module = importlib.import_module(COMMANDS[args[0]][0]) if args and args[0] in COMMANDS else None
    split = getattr(module, "split_args", None)
    if split is None:
        return parser.parse_args(args)
    own, launch = split(args[1:])
    options = parser.parse_args([args[0], *own])
    options.launch_args = launch
    return options


def entry() -> NoReturn:
    """The `reprocut` command: main(), then exit without the interpreter's teardown.

    By then torch is imported (the localizer, the replay oracle), and tearing it down takes
    about half a second after the report is out: time a user waits for nothing. Every file
    reprocut writes is closed by then; the terminal streams are flushed here.
    Killing reprocut kills the processes it started (see reprocut.check.lifeline)."""
    from reprocut.check import lifeline

    lifeline.install_signal_handlers()
    code = main()
    check_log.log("command", at="exit", code=code)  # what follows the result: the teardown
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


def wants_early_server(args: Sequence[str]) -> bool:
    """`shrink` with the fork server (no --no-fork) and not for its help: the server is started
    before the command's imports (check/early_server.py). Abbreviations count (argparse takes
    `--no-f` for --no-fork)."""
    if not args or args[0] != "shrink":
        return False
    options = [arg.split("=", 1)[0] for arg in args[1:]]
    return not any(
        arg == "-h" or (len(arg) > 2 and ("--no-fork".startswith(arg) or "--help".startswith(arg)))
        for arg in options
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check_log.log("command", at="start", args=args[:1])  # before its imports: the start's cost
    if wants_early_server(args):
        early_server.spawn()
    try:
        return _main(args)
    finally:
        early_server.discard()  # the command ended without needing it


def _main(args: list[str]) -> int:
    # imported after the early server's start: rich alone takes a twentieth of a second
    from reprocut.report.display.console import (
        make_console,
        print_error,
        print_internal_error,
        print_line,
    )

    silence_torch_import_warnings()
    parser = build_parser(args[0] if args and args[0] in COMMANDS else "")
    console = make_console()
    try:
        options = _parse(parser, args)
    except SystemExit as exc:
        return ExitCode.OK if exc.code == 0 else ExitCode.USAGE_ERROR
    if options.command is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE_ERROR
    try:
        if options.command not in KILLING:
            return int(options.module.run(options, console))
        sweeper = extension_locks.Sweeper().start()
        try:
            return int(options.module.run(options, console))
        finally:
            sweeper.close()
            for note in lock_notes(sweeper):
                print_line(console, f"[yellow]note[/]: {note}")
    except ReprocutError as exc:
        print_error(console, exc)
        if getattr(options, "json", False):  # machines get an object even when nothing ran
            print(json.dumps(error_json(exc)))
        return int(exc.exit_code)
    except KeyboardInterrupt:
        console.print("interrupted")
        return ExitCode.INTERRUPTED
    except Exception:
        print_internal_error(console)
        return ExitCode.INTERNAL_ERROR


def lock_notes(sweeper: extension_locks.Sweeper) -> list[str]:
    """What the stale locks were: the user may have met the hang they cause before."""
    removed = [
        f"removed {path}: a torch extension build lock that no process held (a process was "
        "killed while it loaded the extension); every later load of it would have waited forever"
        for path in sweeper.removed
    ]
    left = [
        f"left {path}: a torch extension build lock that no process on this machine holds; it "
        "lies on a network filesystem, where another machine's may. If none is building the "
        "extension, remove it: until then every load of it waits"
        for path in sweeper.left
    ]
    return removed + left
