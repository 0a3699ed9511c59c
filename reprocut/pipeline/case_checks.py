"""A captured call's candidates checked side by side, each slot in a folder of its own.

The case passes offer alternatives (a dimension cut alone or with the dimensions linked to it,
the offending index alone or with the others, zeros, ones or randn values); the shrinker's
`consider_first` runs them at once, as many as there are slots (half the cores, at most four:
reprocut.source.speculation.default_slots), and takes their verdicts in the pass's order, so
the repro and the check count are those of one check at a time. Each slot's script is written
in its own folder, its captured tensors' sidecar linked to the first folder's rather than
written again; the plain-run confirmation (reprocut.check.agreement) comes in order, in
`settle`. Not for an out-of-memory (side by side, the checks would share the memory at stake),
nor for a memory fault whose inputs are large (each slot holds its own copy on the GPU, up to
gigabytes): a memory fault's call of up to SIDE_BY_SIDE_BYTES goes side by side (an access
past a tensor faults in its own process's address space, whatever the others hold), which on
the H200 was a Triton op's 68 checks one at a time, 266 s.
"""

from __future__ import annotations

from typing import Any

from reprocut.check.case_script import case_filename, emitted_case
from reprocut.check.oracle import Oracle, Reproduced, Ticket
from reprocut.model.case import ReproCase, Signature
from reprocut.model.recording import Failure
from reprocut.model.signature import is_memory_error
from reprocut.source.speculation import default_slots

SIDE_BY_SIDE_BYTES = 1 << 30  # a memory fault's captured tensors, side by side up to this


class OracleCaseChecks:
    """The shrinker's runner (reprocut.shrink.shrinker.CaseChecks) by the oracle."""

    def __init__(
        self, oracle: Oracle, inputs: dict[str, Any], expected: Signature, slots: int
    ) -> None:
        self.oracle, self.inputs, self.expected, self.slots = oracle, inputs, expected, slots
        self.folders = [oracle.workdir / "slots" / str(k) for k in range(slots)]
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)

    def run(self, case: ReproCase, slot: int, ticket: Ticket | None) -> Any:
        return self.oracle.check_case(case, self.inputs, expected=self.expected,
                                      workdir=self.folders[slot], ticket=ticket, confirm=False)  # fmt: skip

    def settle(self, case: ReproCase, slot: int, verdict: Any) -> Any:
        """The plain-run confirmation, in the pass's order, of the script the check ran."""
        code = emitted_case(case, self.inputs).code
        filename = case_filename(case, code, self.folders[slot])
        return self.oracle.confirm_verdict(code, str(filename), str(self.folders[slot]), [],
                                           verdict, self.expected)  # fmt: skip

    def accepts(self, verdict: Any) -> bool:
        return isinstance(verdict, Reproduced)


def side_by_side(
    oracle: Oracle, failure: Failure, inputs: dict[str, Any], expected: Signature,
    slots: int | None = None,
) -> OracleCaseChecks | None:  # fmt: skip
    """The runner for this failure's case checks, or None (one at a time): forked checks,
    more than one slot, no out-of-memory, and a memory fault's tensors small enough to be held
    once per slot."""
    slots = default_slots() if slots is None else slots
    if not oracle.fork or slots < 2 or failure.memory is not None:
        return None
    if is_memory_error(expected) and not all(
        case_bytes(case) <= SIDE_BY_SIDE_BYTES for case in failure.cases
    ):
        return None
    return OracleCaseChecks(oracle, inputs, expected, slots)


def case_bytes(case: ReproCase) -> int:
    """The bytes a captured call's tensors take on the device: their storages (a view's whole
    storage), a sparse tensor's parts."""
    from reprocut.model.tensors import to_dtype  # torch: not needed to reduce a script

    return sum(
        part.storage_numel * to_dtype(part.dtype).itemsize
        for _, spec in case.tensors()
        for part in spec.parts or (spec,)
    )
