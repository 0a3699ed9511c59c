"""What a fork server is asked to import for its children, and what it answered.

The oracle's part of check/preload.py: one request per server (sent as it starts, or at once to
one running), imports asked for later on top (`more`), and the reply awaited before the next
child is forked. The oracle holds its server lock around every call here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprocut.check import check_log
from reprocut.check.connection import Replies

PRELOAD_TIMEOUT = 300.0  # a trial import and the real one of every preloaded package


class ServerPreload:
    """The preload request every server of an oracle gets, and its reply."""

    def __init__(self) -> None:
        self.request: dict[str, Any] | None = None  # sent to each server
        self.sent: int | None = None  # its id, while its reply is still to come
        self.reply: dict[str, Any] | None = None  # the server's: loaded, refused, unsafe

    def choose(self, modules: list[list[Any]], *, filename: str, cwd: str, argv: list[str]) -> None:
        """These imports (`[module, [names]]`), made as the script at `filename` makes them."""
        self.request = {
            "preload": modules,
            "filename": filename,
            "cwd": cwd,
            "sys_path0": str(Path(filename).resolve().parent),
            "argv": argv,
        }

    def send(self, replies: Replies) -> None:
        """The whole request, to a server that has just started (or runs without it)."""
        if self.request is not None:
            self.sent = replies.send(self.request)

    def more(self, modules: list[list[Any]], replies: Replies | None) -> bool:
        """Add `modules` for every later server, and send them to the running one (`replies`,
        once the request before is answered). False when the server turned out unfit to fork
        (the caller replaces it)."""
        if self.request is None:
            return True
        self.request = {**self.request, "preload": [*self.request["preload"], *modules]}
        if replies is None:
            return True
        if not self.answered(replies):
            return False
        self.sent = replies.send({**self.request, "preload": modules})
        return True

    def answered(self, replies: Replies) -> bool:
        """Wait for the reply to what was sent, once; False when the imports left the server
        unfit to fork (no preload is sent again: the next server imports torch only)."""
        sent, self.sent = self.sent, None
        if sent is None:
            return True
        reply = replies.wait(sent, PRELOAD_TIMEOUT) or {"outcome": "error", "unsafe": None}
        self.reply = reply
        check_log.log(
            "preload", **{k: reply.get(k) for k in ("loaded", "refused", "unsafe", "seconds")}
        )
        if not reply.get("unsafe"):
            return True
        self.request = None
        return False
