"""LineSync names the line after which the GPU first reports a fault.

The GPU itself is stood in for by a fake device whose `synchronize` raises once a "launch" has
queued a fault (the real thing runs in test_record_cuda.py on a GPU).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reprocut.record.inside.line_sync import LineSync


class FakeDevice:
    """torch.cuda as LineSync uses it: a launch queues a fault; the next wait raises it."""

    def __init__(self) -> None:
        self.pending = False
        self.waits = 0

    def is_initialized(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.waits += 1
        if self.pending:
            raise RuntimeError("CUDA error: misaligned address")


def run_user_code(tmp_path: Path, source: str, device: FakeDevice) -> LineSync:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(source).lstrip())
    tracer = LineSync(device)
    with pytest.raises(RuntimeError, match="misaligned address"), tracer:
        exec(compile(path.read_text(), str(path), "exec"), {"device": device})
    return tracer


def test_the_line_that_queued_the_fault_is_named_not_the_one_that_raised(tmp_path: Path):
    tracer = run_user_code(
        tmp_path,
        """
        def normalize(x):
            out = x * 2
            device.pending = True  # the launch
            return out

        total = 0
        for x in range(3):
            total += normalize(x) if x == 2 else x
        print(total)
        """,
        FakeDevice(),
    )
    assert tracer.launch is not None
    assert (tracer.launch.line, tracer.launch.text) == (3, "device.pending = True  # the launch")


def test_a_fault_queued_by_the_scripts_last_line_is_caught_at_its_end(tmp_path: Path):
    device = FakeDevice()
    tracer = run_user_code(tmp_path, "x = 1\ndevice.pending = x > 0\n", device)
    assert tracer.launch is not None and tracer.launch.line == 2
    assert device.waits >= 2  # one wait before each line, and one as the script returns


def test_library_frames_are_not_traced(tmp_path: Path):
    import json

    device = FakeDevice()
    tracer = LineSync(device)
    with tracer:
        json.dumps({"a": [1, 2, 3]})  # the stdlib's lines: no waits
    assert device.waits == 0 and tracer.launch is None


def test_the_step_is_the_one_that_launched_the_kernel_not_the_one_it_surfaced_in(tmp_path):
    """The step's last line launches and steps the optimizer: the fault surfaces after it."""
    path = tmp_path / "train.py"
    path.write_text(
        "for step in range(3):\n"
        "    x = step * 2\n"
        "    device.pending = step == 1; state['step'] += 1  # the launch, optimizer.step()\n"
    )
    device, state = FakeDevice(), {"step": 0}
    tracer = LineSync(device, step=lambda: state["step"])
    with pytest.raises(RuntimeError, match="misaligned address"), tracer:
        exec(compile(path.read_text(), str(path), "exec"), {"device": device, "state": state})
    assert tracer.launch is not None and tracer.launch.line == 3
    assert state["step"] == 2 and tracer.launch_step == 1
