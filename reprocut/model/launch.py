"""How the user's script is launched: a script or `-m` module with its arguments, under torchrun
or not. record/parent/launch.py and record/ranks/torchrun.py parse command lines into these;
the runner, the rank bootstrap and the localizer's reruns launch from them, so every run starts
as the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reprocut.model.errors import ReprocutError

RANK_MODULE = "reprocut.record.ranks.rank"
RANK_PYTHON_OPTIONS = ("-u",)  # torchrun starts every rank as `python -u ...`


class LaunchError(ReprocutError):
    slug = "bad-launch-command"


@dataclass(frozen=True, slots=True)
class TorchrunLaunch:
    """The launcher's part of a torchrun command line (the script and its arguments are the
    Launch's that holds this)."""

    launcher: tuple[str, ...]  # ("/usr/bin/torchrun",) or (python, "-m", "torch.distributed.run")
    options: tuple[str, ...]  # torchrun's own options, as given
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


@dataclass(frozen=True, slots=True)
class Launch:
    """A script or module to run as `__main__`, with the arguments it gets."""

    script: Path | None = None  # the file run as __main__ (for -m: found by `locate`)
    module: str | None = None  # `-m MODULE`: run as `python -m MODULE` would
    args: tuple[str, ...] = ()  # sys.argv[1:]
    argv0: str = ""  # sys.argv[0]: the script as typed, or the module's file
    python_options: tuple[str, ...] = ()  # interpreter options given after `-- python`
    torchrun: TorchrunLaunch | None = None  # `-- torchrun ...`: every rank runs this launch

    def describe(self) -> str:
        """The launch as a python command line, for messages."""
        target = ["-m", self.module] if self.module else [self.argv0 or str(self.script)]
        return " ".join(["python", *self.python_options, *target, *self.args])
