"""Run a training script under reprocut; on failure, find the first op that faulted.

The script runs exactly as `python SCRIPT ARGS...` would (same argv, sys.path, __main__, working
directory, output); `-m MODULE ARGS...` runs a module as `python -m` does, and after `--` comes a
python command line as you would type it (`-- python -m pkg.train --lr 3e-4`). reprocut's own
options go before the script. A script that finishes cleanly gives exit 1, "nothing to
reproduce". On failure, reprocut prints the faulting op, the step and phase (with your own loop
counters), the module path, your source line (and the library line that called torch, under a
framework), the op's input tensors with the facts that explain the failure, the kernel's
assertion, where the error surfaced, and a diagnosis. Everything is stored under .reprocut/runs/<id>/ for `reprocut shrink`.

After `--` may also come a torchrun command (`-- torchrun --nproc-per-node 2 train.py`, or
`-- python -m torch.distributed.run ...`): every rank is recorded and the culprit rank named.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from reprocut.check.warmer import OracleWarmer, gpu_present
from reprocut.model.cell_code import translate_cell
from reprocut.model.compiled import CompiledRun
from reprocut.model.errors import (
    STATUS_EXIT,
    ExitCode,
    ReprocutError,
    ScriptDidNotFailError,
    ScriptNotFoundError,
)
from reprocut.model.failing_test import FailingTest
from reprocut.model.launch import Launch
from reprocut.model.notebook import cell_filename, code_cells, is_notebook, place_of
from reprocut.model.recording import DEFAULT_ROOT, RunDir
from reprocut.record.parent.compiled_run import run_compiled
from reprocut.record.parent.launch import locate, parse_launch, split_command
from reprocut.record.parent.runner import RunRequest, RunResult, run_script
from reprocut.report.display.console import print_line
from reprocut.report.display.failure import failure_json, show_failure

USAGE = (
    "reprocut record [options] SCRIPT [ARGS...]\n"
    "       reprocut record [options] -m MODULE [ARGS...]\n"
    "       reprocut record [options] -- python [PYTHON-OPTIONS] (SCRIPT | -m MODULE) [ARGS...]\n"
    "       reprocut record [options] -- torchrun [TORCHRUN-OPTIONS] (SCRIPT | -m MODULE) [ARGS...]"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="kill the script (and each rerun) after S seconds (default: no limit)",
    )
    parser.add_argument(
        "--launch-blocking",
        action="store_true",
        help="set CUDA_LAUNCH_BLOCKING=1 in the first run too (the localization rerun always has it)",
    )
    parser.add_argument(
        "--no-snapshots",
        dest="snapshots",
        action="store_false",
        help="do not copy asserting ops' inputs during the run (always rerun to localize)",
    )
    parser.add_argument(
        "--full-trace",
        action="store_true",
        help="record every op of every step (runs otherwise record every op of the first "
        "steps and of steps 4, 8, 16, ..., and the ops that can device-assert in every step, "
        "and on a CPU the call that raised: a full trace costs up to 3x on launch-bound GPU "
        "loops, 6x on small CPU models)",
    )
    parser.add_argument(
        "--no-rerun",
        dest="rerun",
        action="store_false",
        help="never rerun the script to localize (only in-process and snapshot replay)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        metavar="DIR",
        help="where recordings are stored (default: ./.reprocut)",
    )
    parser.add_argument(
        "--nan",
        action="store_true",
        help="watch for NaN/inf (a flag per step over losses, gradients, parameters and model "
        "outputs, read without waiting for the GPU); report the first op that made one from "
        "finite inputs, found by a rerun to that step",
    )
    parser.add_argument(
        "--no-compiled-run",
        dest="compiled_run",
        action="store_false",
        help="when the script used torch.compile, do not run it once more compiled (that run "
        "says whether the failure also happens eagerly)",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="watch memory: which op and line made each live tensor, memory per step, and when "
        "it grows, what keeps it alive (a run that does not fail gets this report too); an "
        "out-of-memory failure gets it from a rerun without this option",
    )
    parser.add_argument("--quiet", action="store_true", help="do not echo the script's own output")
    parser.add_argument(
        "--shrink",
        action="store_true",
        help="then write the verified repro.py and report.md, as `reprocut shrink` would, reusing "
        "the warm fork server (exit code: the shrink's)",
    )


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(reprocut's options, the launch command), cut before argparse sees them: argparse would
    take `-m` and the script's own options for reprocut's (cli.py calls this)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    value_options = {
        option
        for action in parser._actions
        if action.nargs != 0
        for option in action.option_strings
    }
    return split_command(args, value_options)


def check_script(script: Path) -> None:
    if not script.exists():
        raise ScriptNotFoundError(f"no such script: {script}", hint="check the path")
    if not script.is_file():
        raise ScriptNotFoundError(f"{script} is not a file")
    if is_notebook(script):
        for cell in code_cells(script):
            _check_compiles(
                translate_cell(cell.source).code, cell_filename(str(script), cell.index)
            )
        return
    _check_compiles(script.read_text(errors="replace"), str(script))


def _check_compiles(source: str, filename: str) -> None:
    try:
        compile(source, filename, "exec")
    except SyntaxError as exc:
        place = place_of(filename, exc.lineno or 0)
        where = place.describe() if place else f"{filename}:{exc.lineno}"
        error = ReprocutError(
            f"{where}: syntax error: {exc.msg}",
            hint="the script does not compile, so it cannot fail in a torch op: fix it first",
        )
        error.exit_code = ExitCode.SCRIPT_ERROR
        error.slug = "script-syntax-error"
        raise error from exc


def run(options: argparse.Namespace, console: Console) -> int:
    cwd = Path.cwd()
    launch = locate(parse_launch(getattr(options, "launch_args", [])), cwd)
    assert launch.script is not None
    check_script(launch.script)
    if launch.torchrun is not None:  # -- torchrun ...: every rank
        from reprocut.commands import record_job

        return record_job.run(options, console, launch, cwd)
    run_dir = RunDir.create(options.root)
    run_dir.write_meta(
        {
            "script": str(launch.script),
            "module": launch.module,
            "argv": list(launch.args),
            "cwd": str(cwd),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "status": "running",
            "env": {"python": platform.python_version(), "platform": platform.platform()},
        }
    )

    # The localizer needs torch (seconds to import): import it while the script runs.
    threading.Thread(
        target=importlib.import_module, args=("reprocut.localize.localizer",), daemon=True
    ).start()
    warm = (options.snapshots and gpu_present()) or options.shrink
    warmer = OracleWarmer(options.timeout or 60.0) if warm else None
    try:
        return _record(options, console, launch, cwd, run_dir, warmer)
    finally:
        if warmer is not None:
            warmer.close()


def _failure_timing(first: RunResult) -> dict[str, float]:
    """Of the script's run: seconds until its failure was known, and from then until its
    process had exited (a process after a CUDA error can take seconds to tear down)."""
    failed_at = (first.outcome or {}).get("failed_at")
    if not (isinstance(failed_at, (int, float)) and first.started_at):
        return {}
    failed_after = failed_at - first.started_at
    return {
        "failed_after_seconds": round(failed_after, 3),
        "exit_after_failure_seconds": round(first.seconds - failed_after, 3),
    }


def _compiled_run(
    options: argparse.Namespace,
    launch: Launch,
    cwd: Path,
    run_dir: RunDir,
    first: RunResult,
    progress: Callable[[str], None],
) -> CompiledRun | None:
    """The script once more as the user ran it, compiled, when it used torch.compile."""
    used = (first.outcome or {}).get("compiled") or []
    if not used or not options.compiled_run:
        return None
    if launch.module == "pytest" or (launch.script and is_notebook(launch.script)):
        progress("torch.compile was used; the compiled run is not made for notebooks and pytest")
        return None  # `python NOTEBOOK` cannot run; pytest's exit says nothing of one failure
    progress(
        f"torch.compile was used ({', '.join(used)}); the recording ran it eagerly. One more "
        "run of the script, compiled as you ran it, says whether the failure needs the "
        "compiler (--no-compiled-run skips it)"
    )
    compiled = run_compiled(launch, cwd, run_dir.path, options.timeout)
    progress(f"compiled run ({compiled.seconds:.1f} s): {compiled.describe()}")
    return compiled


def _record(
    options: argparse.Namespace,
    console: Console,
    launch: Launch,
    cwd: Path,
    run_dir: RunDir,
    warmer: OracleWarmer | None,
) -> int:
    def progress(message: str) -> None:
        print_line(console, f"[bold blue]reprocut[/]: {message}")

    echo = None if options.quiet else (sys.stderr if options.json else sys.stdout)
    script = launch.script
    assert script is not None
    shown = f"-m {launch.module}" if launch.module else launch.argv0
    progress(f"recording {shown} (run {run_dir.id})")
    first = run_script(
        RunRequest(
            script,
            launch.args,
            run_dir.path,
            "record",
            snapshots=options.snapshots,
            light_steps=False if options.full_trace else None,
            launch_blocking=options.launch_blocking,
            nan=options.nan,
            memory=options.memory,
            timeout=options.timeout,
            cwd=cwd,
            launch=launch,
        ),
        echo_stdout=echo,
        echo_stderr=None if options.quiet else sys.stderr,
        on_line=None if warmer is None else warmer.on_line,
    )
    from reprocut.localize.compiled import compile_only, with_compile_verdict
    from reprocut.localize.failure import LocalizeOptions
    from reprocut.localize.localizer import localize

    test = FailingTest.from_json((first.outcome or {}).get("test"))
    under_pytest = launch.module == "pytest"
    if under_pytest and test is None and first.outcome is not None and not first.timed_out:
        progress(
            f"no test failed in a torch op or with a CUDA error (pytest exited {first.returncode})"
        )
        run_dir.write_meta({**run_dir.read_meta(), "status": "passed"})
        if options.json:
            print(json.dumps({"status": "no-failing-test", "exit_code": first.returncode}))
        return first.returncode or 0  # pytest's own

    localize_options = LocalizeOptions(
        script=script,
        argv=launch.args,
        launch=launch,
        frameworks=tuple(((first.outcome or {}).get("frameworks") or {}).items()),
        run_dir=run_dir,
        cwd=cwd,
        timeout=options.timeout,
        launch_blocking=options.launch_blocking,
        snapshots=options.snapshots,
        rerun=options.rerun,
        oracle=None if warmer is None else warmer.ready(),
        nan=options.nan,
        test=test,
        memory=options.memory,
    )
    meta = run_dir.read_meta()
    compiled = _compiled_run(options, launch, cwd, run_dir, first, progress)
    localize_started = time.perf_counter()
    try:
        failure = localize(localize_options, first, progress)
    except ScriptDidNotFailError:
        if compiled is None or not compiled.failed or compiled.timed_out:
            run_dir.write_meta({**meta, "status": "passed", "seconds": round(first.seconds, 3)})
            if options.memory:  # the growth and leak report of a run that did not fail
                from reprocut.commands.memory_run import report_passed

                return report_passed(options, console, run_dir)
            raise
        failure = compile_only(localize_options, first, compiled)  # it fails only compiled
    else:
        failure = with_compile_verdict(localize_options, first, compiled, failure)
    meta.update(  # where the time went: the script's run, then finding the culprit
        status=failure.status,
        seconds=round(first.seconds, 3),
        localize_seconds=round(time.perf_counter() - localize_started, 3),
        **_failure_timing(first),
    )
    run_dir.write_meta(meta)
    if not options.json:
        show_failure(console, failure, run_dir.path)
    code = STATUS_EXIT.get(failure.status, ExitCode.NOT_LOCALIZED)
    report = failure_json(failure, run_dir.path)
    if options.shrink and code == ExitCode.OK:
        from reprocut.commands.shrink import shrink_recorded

        oracle = None if warmer is None else warmer.ready()
        code, report["shrink"] = shrink_recorded(run_dir, failure, oracle, console, options.json)
    if options.json:
        print(json.dumps(report, indent=2))
    if under_pytest and not options.shrink and first.returncode is not None:
        return first.returncode  # pytest's, as without reprocut
    return code
