"""How pytest's first test failing in a torch op reaches child.py (kept apart from
pytest_watch.py, which imports pytest and torch: child.py imports torch only once the
environment is set)."""

from __future__ import annotations

from typing import Any


class FailedTest(BaseException):
    """The first test that failed in a torch op, raised once pytest has ended: `error` is the
    test's own error, `test` its node id, file and line, `exit_code` pytest's."""

    def __init__(self, error: BaseException, test: dict[str, Any], exit_code: int) -> None:
        super().__init__(test["nodeid"])
        self.error = error
        self.test = test
        self.exit_code = exit_code
