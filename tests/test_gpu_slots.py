"""The machine-wide bound on GPU checks in flight (reprocut.check.gpu_slots): real lock files,
real threads and a real second process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from reprocut.check.gpu_slots import gpu_slot, machine_slots


def test_a_quarter_of_the_cores_at_least_one_shrinks_four_at_most_eight() -> None:
    assert machine_slots(2) == 4
    assert machine_slots(16) == 4
    assert machine_slots(32) == 8
    assert machine_slots(128) == 8


def test_a_check_waits_while_every_slot_is_held_and_takes_one_freed(tmp_path: Path) -> None:
    events: list[str] = []
    with gpu_slot(2, tmp_path) as first, gpu_slot(2, tmp_path) as second:
        assert {first, second} == {0, 1}

        def third() -> None:
            with gpu_slot(2, tmp_path) as slot:
                events.append(f"got {slot}")

        waiting = threading.Thread(target=third)
        waiting.start()
        time.sleep(0.3)
        assert events == []  # both slots held: it waits
        events.append("released")
    waiting.join(timeout=5)
    assert events[0] == "released" and events[1].startswith("got ")


HOLDER = """
import sys, time
from pathlib import Path
from reprocut.check.gpu_slots import gpu_slot
with gpu_slot(1, Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_slot_held_by_a_process_that_dies_is_free_again(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        got: list[int] = []

        def take() -> None:
            with gpu_slot(1, tmp_path) as slot:
                got.append(slot)

        waiting = threading.Thread(target=take)
        waiting.start()
        time.sleep(0.3)
        assert got == []  # the other process holds the only slot
        holder.kill()  # killed, not released: the kernel drops its lock
        waiting.join(timeout=5)
        assert got == [0]
    finally:
        holder.kill()
        holder.wait()
