"""The machine's check slots: shared by every process of a user, free to cancel while waiting."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from reprocut.check.connection import Ticket
from reprocut.check.machine_slots import MachineSlots
from reprocut.check.oracle import Cancelled, Oracle, Passed

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_slot_held_by_another_process_is_waited_for_and_taken_when_it_dies(tmp_path: Path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "slot-0.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        slots = MachineSlots(1, tmp_path)
        deadline = time.monotonic() + 0.5
        with slots.held(lambda: time.monotonic() > deadline) as waited:
            assert waited is None  # still held elsewhere when the wait was given up
        holder.kill()  # the kernel releases a dead process's lock
        holder.wait()
        with slots.held() as waited:
            assert waited is not None and waited < 5
    finally:
        holder.kill()


def test_two_slots_let_two_holders_in_and_the_third_waits(tmp_path: Path):
    slots = MachineSlots(2, tmp_path)
    inside = threading.Barrier(3, timeout=10)
    release = threading.Event()
    got: list[float | None] = []

    def hold() -> None:
        with slots.held() as waited:
            got.append(waited)
            inside.wait()
            release.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()  # both are in
    stop = threading.Event()
    third: list[float | None] = []
    waiter = threading.Thread(target=lambda: third.append(_hold_until(slots, stop)))
    waiter.start()
    time.sleep(0.3)
    assert not third  # no third slot
    release.set()
    waiter.join(10)
    assert third and third[0] is not None
    for thread in threads:
        thread.join(10)


def _hold_until(slots: MachineSlots, stop: threading.Event) -> float | None:
    with slots.held(stop.is_set) as waited:
        return waited


def test_a_check_cancelled_while_it_waits_for_a_slot_never_runs(tmp_path: Path):
    with Oracle(timeout=60) as oracle:
        oracle.machine_slots = MachineSlots(1, tmp_path / "slots")
        oracle.warm_up()
        script = tmp_path / "c.py"
        running = tmp_path / "running"
        seen: list[object] = []

        def first() -> None:
            code = f"import time\nopen({str(running)!r}, 'w').close()\ntime.sleep(5)\n"
            seen.append(oracle.check_source(code, filename=str(script), cwd=tmp_path))

        long = threading.Thread(target=first)
        long.start()
        deadline = time.monotonic() + 60
        while not running.exists() and time.monotonic() < deadline:  # it holds the one slot
            time.sleep(0.05)
        assert running.exists()
        marker = tmp_path / "ran"
        ticket = Ticket()
        threading.Timer(0.5, ticket.cancel).start()
        verdict = oracle.check_source(
            f"open({str(marker)!r}, 'w').close()\n", filename=str(script), cwd=tmp_path,
            ticket=ticket,
        )  # fmt: skip
        assert isinstance(verdict, Cancelled)
        long.join(30)
        assert seen and isinstance(seen[0], Passed)
        assert not marker.exists()
        assert oracle.checks == 1  # the cancelled one is not a check


def test_slots_are_ranked_by_how_far_ahead_of_its_turn_a_check_runs(tmp_path: Path):
    slots = MachineSlots(8, tmp_path)
    assert [slots.allowed(ahead) for ahead in range(5)] == [8, 4, 2, 1, 1]
    assert MachineSlots(2, tmp_path).allowed(1) == 1


def test_a_bet_waits_for_the_low_slots_and_takes_any_once_its_turn_comes(tmp_path: Path):
    slots = MachineSlots(4, tmp_path)
    inside = threading.Barrier(3, timeout=10)
    release = threading.Event()

    def hold() -> None:  # the lowest two: all a check one step ahead may take
        with slots.held(ahead=lambda: 1):
            inside.wait()
            release.wait(10)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for thread in holders:
        thread.start()
    inside.wait()
    ahead = [1]
    got: list[float | None] = []
    waiter = threading.Thread(target=lambda: got.append(_hold_ahead(slots, ahead)))
    waiter.start()
    time.sleep(0.3)
    assert not got  # two slots free, but not for a bet one step ahead
    ahead[0] = 0  # the check before it was answered: now it is the one its shrink waits on
    waiter.join(10)
    assert got and got[0] is not None
    release.set()
    for thread in holders:
        thread.join(10)


def _hold_ahead(slots: MachineSlots, ahead: list[int]) -> float | None:
    with slots.held(ahead=lambda: ahead[0]) as waited:
        return waited


def test_speculation_tells_each_check_how_far_ahead_of_its_turn_it_runs():
    from reprocut.source.speculation import Speculation

    started = threading.Barrier(3, timeout=10)
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    class Recording:
        slots = 3

        def run(self, code: str, slot: int, ticket: Ticket | None) -> bool:
            assert ticket is not None
            with lock:
                seen[code] = [ticket.ahead]
            if code in "abc":
                started.wait()  # the first three in flight together
            time.sleep({"a": 0.2, "b": 1.0}.get(code, 0.5))  # c looks while b still runs
            with lock:
                seen[code].append(ticket.ahead)
            return code == "d"

        def settle(self, code: str, slot: int, verdict: bool) -> bool:
            return verdict

    class Reducer:
        best = ""

        def admissible(self, candidate: str, pass_name: str | None = None) -> bool:
            return True

        def upcoming(self) -> Iterator[tuple[str, str]]:
            return iter(())

        def is_same_failure(self, verdict: bool) -> bool:
            return verdict

        def out_of_budget(self, in_flight: int) -> str | None:
            return None

        def take(self, candidate: str, verdict: bool, pass_name: str) -> bool:
            return verdict

    speculation = Speculation(Recording())
    try:
        chosen = speculation.first_accepted(Reducer(), [(c, c) for c in "abcd"], "p")
    finally:
        speculation.close()
    assert chosen == ("d", "d")
    assert [seen[c][0] for c in "abc"] == [0, 1, 2]  # at the start: its place in the queue
    assert seen["b"][1] == 0 and seen["c"][1] == 1  # "a" answered (rejected): one step nearer
