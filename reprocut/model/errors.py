"""Errors the user can act on, and the exit codes the CLI returns.

A leaf module: it imports nothing from reprocut, so every stage can raise these.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes of the `reprocut` command (docs/reference/exit-codes.md lists them)."""

    OK = 0  # failure recorded and localized, or repro written and verified
    NOT_REPRODUCED = 1  # the script passed, or the repro lost the signature
    INTERRUPTED = 2  # Ctrl-C
    INTERNAL_ERROR = 3  # a bug in reprocut: please report it
    USAGE_ERROR = 4  # bad arguments, missing script, missing or corrupt recording
    SCRIPT_ERROR = 5  # the script failed, but not in a torch op (syntax error, plain Python error)
    TIMEOUT = 6  # the script (or a check) ran past --timeout
    NOT_LOCALIZED = 7  # the failure was recorded but its first faulting op could not be pinned down
    FLAKY = 8  # the repro fails only some of the time
    MEMORY_HELD = 9  # out of memory only because other memory was held: no op-level repro


class ReprocutError(Exception):
    """A problem the user can act on: shown as message + hint, no traceback."""

    exit_code: ExitCode = ExitCode.USAGE_ERROR
    slug: str = "error"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ScriptNotFoundError(ReprocutError):
    slug = "script-not-found"


class NoRecordingError(ReprocutError):
    slug = "no-recording"


class CorruptRecordingError(ReprocutError):
    slug = "corrupt-recording"


class ScriptDidNotFailError(ReprocutError):
    slug = "script-did-not-fail"
    exit_code = ExitCode.NOT_REPRODUCED


class ScriptTimeoutError(ReprocutError):
    slug = "script-timeout"
    exit_code = ExitCode.TIMEOUT


class NotReproducedError(ReprocutError):
    slug = "not-reproduced"
    exit_code = ExitCode.NOT_REPRODUCED


class MemoryHeldError(ReprocutError):
    """The allocation failed only because other memory was held (a leak, saved activations):
    an op-level repro with the same shapes would not fail; the memory report says why."""

    slug = "memory-held"
    exit_code = ExitCode.MEMORY_HELD


class EmitError(ReprocutError):
    """A case holds something the emitter cannot write as Python source."""

    slug = "cannot-emit"
    exit_code = ExitCode.INTERNAL_ERROR


# a recording's Failure.status -> the exit code of `record`
STATUS_EXIT = {
    "localized": ExitCode.OK,
    "outside-dispatcher": ExitCode.OK,
    "not-localized": ExitCode.NOT_LOCALIZED,
    "script-error": ExitCode.SCRIPT_ERROR,
    "nonfinite-input": ExitCode.OK,
    "compile-only": ExitCode.OK,  # fails only under torch.compile: shrink reduces the script
}
