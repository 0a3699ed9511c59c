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


# a library's kernel (its frames are not the user's): an id past the table queues a fault on the
# fake device; as a kernel writing through a raw pointer does, it changes its input without a
# version bump
_LIBRARY = compile(
    "def scatter_kernel(device, ids, table):\n"
    "    if int(ids.max()) >= table.shape[0]:\n"
    "        device.pending = True\n"
    "    ids.numpy()[:] = 0\n"
    "def raising_kernel(grid, n):\n"
    "    raise RuntimeError('CUDA error: misaligned address')\n",
    "fakelib/_kernels.pyx",
    "exec",
)
FAKELIB: dict = {}
exec(_LIBRARY, FAKELIB)

LAUNCHING = """
import torch

def scatter(ids, table):
    out = table.clone()
    scatter_kernel(device, ids, table)  # the launch
    return out

table = torch.zeros(64, 4)
for step in range(3):
    state["step"] = step
    ids = torch.tensor([3, 70 if step == 2 else 7, 5])
    scatter(ids, table)
"""


def test_the_rerun_reads_the_launchs_inputs_its_ids_as_they_were_before_it_ran(tmp_path):
    """Once the fault shows, the device answers nothing: the ids' range was read as the launch
    line was about to run, not after (the kernel zeroed them through a raw view)."""
    import json

    from reprocut.record.inside.launch_read import LaunchReader

    path = tmp_path / "train.py"
    path.write_text(LAUNCHING.lstrip())
    kept = tmp_path / "launch_probe.json"
    device, state = FakeDevice(), {"step": 0}
    tracer = LineSync(device, step=lambda: state["step"], window=(2, 2),
                      reader=LaunchReader(kept, str(path), ["--fast"]))  # fmt: skip
    namespace = {"device": device, "state": state, "scatter_kernel": FAKELIB["scatter_kernel"]}
    with pytest.raises(RuntimeError, match="misaligned address") as raised, tracer:
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert tracer.launch is not None and tracer.launch.line == 5 and tracer.launch_step == 2
    assert device.waits < 40  # waits in step 2 only, not in steps 0 and 1
    assert tracer.read_launch(raised.value)
    written = json.loads(kept.read_text())
    assert (written["line"], written["focus"], written["read_by"]) == (
        5,
        "scatter_kernel(device, ids, table)",
        "rerun",
    )
    assert written["script"] == str(path.resolve()) and written["argv"] == ["--fast"]
    found = written["found"]
    assert found["integers"] == [
        ["ids", {"low": 3, "high": 70, "low_at": 0, "high_at": 1, "shape": [3]}]
    ]
    assert namespace["ids"].tolist() == [0, 0, 0]  # what the kernel left: not what it was given
    assert [name for name, _ in found["params"]] == ["ids", "table"]
    assert [p["name"] for p in found["pointers"]] == ["ids", "table", "out"]
    from reprocut.source.probe import kept_launch

    read = kept_launch(kept, path, ["--fast"])
    assert read is not None and read.line == 5 and dict(read.specs.integers)["ids"].high == 70


def test_a_launch_that_raises_itself_is_read_from_the_traceback(tmp_path):
    """Triton's and CuPy's launches raise at the launch under blocking launches: the frame to
    read is the innermost user frame of the error, not the line the waits last saw."""
    import json

    from reprocut.record.inside.launch_read import LaunchReader

    path = tmp_path / "train.py"
    path.write_text("def launch(n):\n    grid = (n // 4,)\n    kernel(grid, n)\n")
    kept = tmp_path / "launch_probe.json"
    kernel = FAKELIB["raising_kernel"]
    device = FakeDevice()
    tracer = LineSync(device, reader=LaunchReader(kept, str(path), []))
    with pytest.raises(RuntimeError) as raised, tracer:
        exec(compile(path.read_text() + "launch(4096)\n", str(path), "exec"), {"kernel": kernel})
    assert tracer.launch is None
    assert tracer.read_launch(raised.value)
    found = json.loads(kept.read_text())["found"]
    assert found["launch"]["args"] == [[1024], 4096] and found["values"] == [["n", 4096]]


def test_noted_ranges_follow_each_tensor_while_it_lives_and_its_version_holds():
    import sys

    import torch

    from reprocut.record.inside.launch_read import RangeCache

    cache = RangeCache()
    ids = torch.tensor([1, 9])
    with torch.inference_mode():
        frozen = torch.tensor([4, 2])  # keeps no version counter
    cache.note(sys._getframe())
    ids.numpy()[1] = 50  # written as a kernel writes, through memory: no new version
    assert cache.read(ids) == {"low": 1, "high": 9, "low_at": 0, "high_at": 1, "shape": [2]}
    ids.add_(1)  # an op's write: a new version, read again
    assert cache.read(ids) == {"low": 2, "high": 51, "low_at": 0, "high_at": 1, "shape": [2]}
    assert cache.read(frozen) == {"low": 2, "high": 4, "low_at": 1, "high_at": 0, "shape": [2]}
    assert cache.read(torch.ones(2)) is None  # floats have no id range
