"""`reprocut record -- torchrun ...`: read the launcher's command line and rewrite it so that
every rank runs under the recorder.

torchrun starts `python -u SCRIPT ARGS` once per rank; reprocut hands it `python -u -m
reprocut.record.rank CONFIG` instead (torchrun's own `--module` form), and that bootstrap runs
the user's script under the recorder in the rank's own folder. torchrun's options go to the real
torchrun unchanged; they are read with torchrun's own parser, so that abbreviations,
`--opt=value` and PET_* environment defaults mean here what they mean to torchrun.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reprocut.model.errors import ReprocutError

RANK_MODULE = "reprocut.record.rank"
RUN_MODULE = "torch.distributed.run"
_PYTHON = re.compile(r"python[0-9.]*(\.exe)?")
_PYTHON_FLAGS = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-q"}


class LaunchError(ReprocutError):
    slug = "bad-launcher"


@dataclass(frozen=True, slots=True)
class TorchrunLaunch:
    """A torchrun command line, split where torchrun splits it."""

    launcher: tuple[str, ...]  # ("/usr/bin/torchrun",) or (python, "-m", "torch.distributed.run")
    options: tuple[str, ...]  # torchrun's own options, as given
    script: str
    script_args: tuple[str, ...]
    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: str = "1"
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    standalone: bool = False
    max_restarts: int = 0

    def command(self, config: Path) -> list[str]:
        """torchrun with the user's options, each rank started as reprocut's bootstrap.

        `--max-restarts 0` goes last, so it wins over the user's: a restart would only repeat
        the fault, and the first attempt's ranks hold its evidence."""
        return [
            *self.launcher,
            *self.options,
            "--max-restarts",
            "0",
            "--module",
            RANK_MODULE,
            str(config),
        ]

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def job_key(self) -> str:
        """Names the job alike on every node, so that nodes sharing a --root share its folder."""
        raw = f"{self.rdzv_backend}-{self.rdzv_endpoint}-{self.rdzv_id}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)

    def notes(self) -> list[str]:
        if self.max_restarts > 0:
            return [
                f"torchrun's --max-restarts {self.max_restarts} is set to 0 under reprocut: a "
                "restart would only repeat the fault, and the first attempt holds its evidence"
            ]
        return []


def is_launcher(argv: Sequence[str]) -> bool:
    """`torchrun ...` or `python -m torch.distributed.run ...` (the legacy launch module too,
    so that parse_launch can say why it is refused)."""
    return _launcher_length(argv) > 0


def _launcher_length(argv: Sequence[str]) -> int:
    if not argv:
        return 0
    name = os.path.basename(argv[0])
    if name == "torchrun":
        return 1
    if not _PYTHON.fullmatch(name):
        return 0
    i = 1
    while i < len(argv) and argv[i] in _PYTHON_FLAGS:
        i += 1
    if i + 1 < len(argv) and argv[i] == "-m" and argv[i + 1].startswith("torch.distributed."):
        return i + 2
    return 0


def parse_launch(argv: Sequence[str]) -> TorchrunLaunch:
    """Split a torchrun command line into torchrun's options and the training script."""
    n = _launcher_length(argv)
    launcher = list(argv[:n])
    if launcher[-1] == "torch.distributed.launch":
        raise LaunchError(
            "torch.distributed.launch is not supported (it is deprecated and passes --local-rank)",
            hint="use `torchrun` or `python -m torch.distributed.run` with the same options",
        )
    found = shutil.which(launcher[0])
    if found is None:
        raise LaunchError(
            f"{launcher[0]} not found", hint="is torch installed in this environment?"
        )
    launcher[0] = found
    rest = list(argv[n:])
    from torch.distributed.run import get_args_parser  # torchrun's own parser: imports torch

    parser = get_args_parser()
    parser.prog = "torchrun"
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:
        raise LaunchError(
            "torchrun could not parse its arguments (its message is above)",
            hint="the command after `--` must run as it is without reprocut",
        ) from exc
    for flag, why in (
        ("module", "-m/--module: pass the training script's path instead of a module"),
        ("no_python", "--no-python: reprocut records Python training scripts only"),
        ("run_path", "--run-path: each rank must run in its own Python process"),
    ):
        if getattr(args, flag, False):
            raise LaunchError(f"torchrun {why.split(':')[0]} is not supported", hint=why)
    split = len(rest) - len(args.training_script_args) - 1
    if split < 0 or rest[split] != args.training_script:
        raise LaunchError(f"cannot find the training script in: {' '.join(rest)}")
    options = rest[:split]
    if options and options[-1] == "--":
        options = options[:-1]
    script = Path(args.training_script)
    if not script.is_file():
        raise LaunchError(f"no such training script: {script}", hint="check the path")
    min_nodes, _, max_nodes = args.nnodes.partition(":")
    return TorchrunLaunch(
        launcher=tuple(launcher),
        options=tuple(options),
        script=str(script),
        script_args=tuple(args.training_script_args),
        min_nodes=int(min_nodes),
        max_nodes=int(max_nodes or min_nodes),
        nproc_per_node=str(args.nproc_per_node),
        rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint or f"{args.master_addr}:{args.master_port or 29500}",
        rdzv_id=args.rdzv_id,
        standalone=bool(args.standalone),
        max_restarts=int(args.max_restarts),
    )
