"""`reprocut record -- torchrun ...`: read the launcher's command line and rewrite it so that
every rank runs under the recorder.

record/parent/launch.py's `parse_command` recognizes the launcher (`torchrun`, `python -m
torch.distributed.run`) and hands its command line here. torchrun starts `python -u SCRIPT ARGS`
(or `python -u -m MODULE ARGS`) once per rank; reprocut hands it `python -u -m
reprocut.record.ranks.rank CONFIG` instead (torchrun's own `--module` form), and that bootstrap
runs the user's script under the recorder in the rank's own folder, launched as torchrun would
have launched it. torchrun's options go to the real torchrun unchanged; they are read with torchrun's
own parser, so that abbreviations, `--opt=value` and PET_* environment defaults mean here what
they mean to torchrun.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from reprocut.model.launch import RANK_PYTHON_OPTIONS, Launch, LaunchError, TorchrunLaunch


def parse_torchrun(launcher_tokens: Sequence[str], rest: Sequence[str]) -> Launch:
    """The launch every rank runs, with the launcher's part as its `torchrun`: `launcher_tokens`
    name the launcher (as record/parent/launch.py's `torchrun_prefix` cut them), `rest` is torchrun's
    own command line (its options, then the training script or module and its arguments)."""
    launcher = list(launcher_tokens)
    rest = list(rest)
    if launcher[-1].removeprefix("-m") == "torch.distributed.launch":
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
    min_nodes, _, max_nodes = args.nnodes.partition(":")
    torchrun = TorchrunLaunch(
        launcher=tuple(launcher),
        options=tuple(options),
        min_nodes=int(min_nodes),
        max_nodes=int(max_nodes or min_nodes),
        nproc_per_node=str(args.nproc_per_node),
        rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint or f"{args.master_addr}:{args.master_port or 29500}",
        rdzv_id=args.rdzv_id,
        standalone=bool(args.standalone),
        max_restarts=int(args.max_restarts),
    )
    target = args.training_script
    rank_args = tuple(args.training_script_args)
    if args.module:  # `torchrun -m MODULE`: each rank is `python -u -m MODULE`
        return Launch(
            module=target, args=rank_args, python_options=RANK_PYTHON_OPTIONS, torchrun=torchrun
        )
    return Launch(
        script=Path(target),
        args=rank_args,
        argv0=target,
        python_options=RANK_PYTHON_OPTIONS,
        torchrun=torchrun,
    )
