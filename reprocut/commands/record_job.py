"""`reprocut record [options] -- torchrun [torchrun options] train.py [args]`: a whole torchrun job.

The real torchrun runs the real script; every rank runs under the recorder into its own folder
(ranks/<rank>/, each a complete single-process recording). Once the job has ended, the culprit
rank is chosen from the ranks' own evidence, its first faulting op localized as for one process,
and the report names it with one line per other rank. `reprocut shrink` (or `--shrink`) then
shrinks the culprit rank's recording into a single-process repro.py. commands/record.py hands
over every launch that record/parent/launch.py parsed with a `torchrun` part.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

from reprocut.check.warmer import OracleWarmer, gpu_present
from reprocut.model.errors import STATUS_EXIT, ExitCode, ScriptDidNotFailError
from reprocut.model.job import rank_path
from reprocut.model.launch import Launch
from reprocut.model.recording import RunDir
from reprocut.record.ranks.job import JobRequest, node_id, open_job_dir, run_job
from reprocut.report.display.failure import failure_json, show_failure


def run(options: argparse.Namespace, console: Console, launch: Launch, cwd: Path) -> ExitCode:
    """`launch` is located (its script checked) and has its `torchrun`."""

    def progress(message: str) -> None:
        console.print(f"[bold blue]reprocut[/]: {message}")

    torchrun, script = launch.torchrun, launch.script
    assert torchrun is not None and script is not None
    # The localizer needs more of torch (seconds to import): import it while the job runs.
    threading.Thread(
        target=importlib.import_module, args=("reprocut.localize.ranks",), daemon=True
    ).start()
    node = node_id()
    run_dir, created = open_job_dir(options.root, torchrun, node)
    if created:
        run_dir.write_meta(
            {
                "script": str(script),
                "module": launch.module,
                "argv": list(launch.args),
                "launcher": [*torchrun.launcher, *torchrun.options],
                "cwd": str(cwd),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "status": "running",
                "env": {"python": platform.python_version(), "platform": platform.platform()},
            }
        )
    notes = torchrun.notes()
    for note in notes:
        progress(note)
    joined = "" if created else " (joined another node's recording)"
    shown = f"-m {launch.module}" if launch.module else launch.argv0
    progress(f"recording {shown} under torchrun, every rank (run {run_dir.id}){joined}")
    warm = (options.snapshots and gpu_present()) or options.shrink
    warmer = OracleWarmer(options.timeout or 60.0) if warm else None
    try:
        job = run_job(
            JobRequest(
                launch,
                run_dir,
                node,
                snapshots=options.snapshots,
                light_steps=False if options.full_trace else None,
                timeout=options.timeout,
                cwd=cwd,
                quiet=options.quiet,
            ),
            echo_stdout=None if options.quiet else (sys.stderr if options.json else sys.stdout),
            echo_stderr=None if options.quiet else sys.stderr,
            on_line=None if warmer is None else warmer.on_line,
        )
        from reprocut.localize.failure import LocalizeOptions
        from reprocut.localize.ranks import localize_job

        localize_options = LocalizeOptions(
            script=script,
            argv=launch.args,
            launch=launch,
            run_dir=run_dir,
            cwd=cwd,
            timeout=options.timeout,
            launch_blocking=options.launch_blocking,
            snapshots=options.snapshots,
            rerun=options.rerun,  # reruns the whole job, the culprit rank synchronized
            oracle=None if warmer is None else warmer.ready(),
        )
        started = time.perf_counter()
        meta = run_dir.read_meta()
        meta.update(world_size=job.world_size, nodes=job.nodes, seconds=round(job.seconds, 3))
        try:
            failure = localize_job(job, localize_options, progress, notes)
        except ScriptDidNotFailError:
            run_dir.write_meta({**meta, "status": "passed"})
            raise
        meta.update(
            status=failure.status,
            culprit_rank=failure.rank,
            localize_seconds=round(time.perf_counter() - started, 3),
        )
        run_dir.write_meta(meta)
        if not options.json:
            show_failure(console, failure, run_dir.path)
        code = STATUS_EXIT.get(failure.status, ExitCode.NOT_LOCALIZED)
        report = failure_json(failure, run_dir.path)
        if options.shrink and code == ExitCode.OK and failure.rank is not None:
            from reprocut.commands.shrink import shrink_recorded

            culprit = RunDir(rank_path(run_dir.path, failure.rank))  # as `reprocut shrink` picks
            oracle = None if warmer is None else warmer.ready()
            code, report["shrink"] = shrink_recorded(
                culprit, failure, oracle, console, options.json
            )
    finally:
        if warmer is not None:
            warmer.close()
    if options.json:
        print(json.dumps(report, indent=2))
    return code
