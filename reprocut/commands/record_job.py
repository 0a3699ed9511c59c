"""`reprocut record [options] -- torchrun [torchrun options] train.py [args]`: a whole torchrun job.

The real torchrun runs the real script; every rank runs under the recorder into its own folder
(ranks/<rank>/, each a complete single-process recording). Once the job has ended, the culprit
rank is chosen from the ranks' own evidence, its first faulting op localized as for one process,
and the report names it with one line per other rank. `reprocut shrink` then shrinks the
culprit rank's recording into a single-process repro.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from reprocut.commands.record import STATUS_EXIT, OracleWarmer, check_script, gpu_present
from reprocut.model.errors import ExitCode, ScriptDidNotFailError
from reprocut.record.ranks import JobRequest, node_id, open_job_dir, run_job
from reprocut.record.torchrun import parse_launch
from reprocut.report.display.failure import failure_json, show_failure


def run(options: argparse.Namespace, console: Console, argv: Sequence[str]) -> ExitCode:
    def progress(message: str) -> None:
        console.print(f"[bold blue]reprocut[/]: {message}")

    launch = parse_launch(argv)  # torchrun's parser imports torch: never in two threads at once
    # The localizer needs more of torch (seconds to import): import it while the job runs.
    threading.Thread(
        target=importlib.import_module, args=("reprocut.localize.ranks",), daemon=True
    ).start()
    script = Path(launch.script)
    check_script(script)
    node = node_id()
    run_dir, created = open_job_dir(options.root, launch, node)
    cwd = Path.cwd()
    if created:
        run_dir.write_meta(
            {
                "script": str(script.resolve()),
                "argv": list(launch.script_args),
                "launcher": [*launch.launcher, *launch.options],
                "cwd": str(cwd),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "status": "running",
                "env": {"python": platform.python_version(), "platform": platform.platform()},
            }
        )
    notes = launch.notes()
    for note in notes:
        progress(note)
    joined = "" if created else " (joined another node's recording)"
    progress(f"recording {script} under torchrun, every rank (run {run_dir.id}){joined}")
    warmer = OracleWarmer(options.timeout or 60.0) if options.snapshots and gpu_present() else None
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
            script=script.resolve(),
            argv=launch.script_args,
            run_dir=run_dir,
            cwd=cwd,
            timeout=options.timeout,
            launch_blocking=options.launch_blocking,
            snapshots=options.snapshots,
            rerun=False,  # a rerun would have to rerun the whole job: not done (yet)
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
    finally:
        if warmer is not None:
            warmer.close()
    meta.update(
        status=failure.status,
        culprit_rank=failure.rank,
        localize_seconds=round(time.perf_counter() - started, 3),
    )
    run_dir.write_meta(meta)
    if options.json:
        print(json.dumps(failure_json(failure, run_dir.path), indent=2))
    else:
        show_failure(console, failure, run_dir.path)
    return STATUS_EXIT.get(failure.status, ExitCode.NOT_LOCALIZED)
