"""Snapshot replay: find the faulting op among the failing step's asserting ops.

Takes the snapshots the first run copied to host before each asserting op of the failing step,
and the run's saved inputs; replays them one at a time in fresh fork-server children (the
Oracle), likeliest first, and hands on the Failure for the first that faults with a CUDA error,
or None so that the caller reruns the script instead.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reprocut.localize.culprit import from_culprit, load_inputs, repro_case
from reprocut.localize.explain import explain_inputs
from reprocut.localize.failure import LocalizeOptions, Progress
from reprocut.model.recording import Failure
from reprocut.record.parent.runner import RunResult


def replay_snapshots(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], progress: Progress
) -> Failure | None:
    """Replay the failing step's asserting ops from their host snapshots, in order."""
    try:
        from reprocut.check.oracle import Oracle
    except ImportError:
        return None
    inputs = load_inputs(options.run_dir)
    snapshots = rank_snapshots(outcome["snapshots"], inputs)
    progress(f"replaying up to {len(snapshots)} asserting op(s) from snapshots, likeliest first")
    oracle = options.oracle or Oracle(timeout=options.timeout or 60.0)
    try:
        for snapshot in snapshots:
            case = repro_case(
                snapshot["target"], snapshot["call"], None, snapshot["op"], snapshot.get("source")
            )
            verdict = oracle.check_case(case, inputs)
            signature = getattr(verdict, "signature", None)
            if signature is not None and signature.error_code is not None:
                culprit = {**snapshot, "synchronized": True, "forward_source": None}
                return from_culprit(
                    options,
                    first,
                    outcome,
                    culprit,
                    first,
                    "snapshot-replay",
                    signature=replace(signature, op=snapshot["op"]),
                    replay_stderr=getattr(verdict, "stderr", ""),
                    replay_error={
                        "type": signature.error_type,
                        "message": getattr(verdict, "message", ""),
                        "code": signature.error_code,
                    },
                    inputs=inputs,
                )
    finally:
        if options.oracle is None:
            oracle.close()
    return None


def rank_snapshots(snapshots: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """Snapshots whose captured evidence already shows a violation first, then in run order.

    A replay costs a process; reading the captured indices costs nothing. The host copies of ops
    queued after the fault may hold garbage, so evidence only orders the checks: a replay decides.
    """

    def violates(snapshot: dict[str, Any]) -> bool:
        try:
            tensors, _ = explain_inputs({**snapshot, "synchronized": True}, inputs)
        except Exception:
            return False
        return any(
            "≥" in fact or "<" in fact or "NaN" in fact or "outside" in fact
            for row in tensors
            for fact in row.facts
            if not fact.startswith("all ")
        )

    flagged = [s for s in snapshots if violates(s)]
    return flagged + [s for s in snapshots if s not in flagged]
