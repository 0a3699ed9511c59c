"""Verification by plain `python repro.py` runs, and reading a signature back from a traceback."""

from __future__ import annotations

from pathlib import Path

from reprocut.check.verify import signature_from_stderr, verify
from reprocut.model.case import Signature
from reprocut.model.errors import ExitCode
from reprocut.model.signature import last_exception

CUDA_STDERR = """\
/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1553: indexSelectSmallIndex: block: [0,0,0], thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
Traceback (most recent call last):
  File "/tmp/repro.py", line 20, in <module>
    main()
  File "/tmp/repro.py", line 17, in main
    torch.cuda.synchronize()
torch.AcceleratorError: CUDA error: device-side assert triggered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""


def test_cuda_traceback_gives_code_and_assertion_kind() -> None:
    error_type, message = last_exception(CUDA_STDERR) or ("", "")
    assert error_type == "AcceleratorError"
    assert message.startswith("CUDA error: device-side assert triggered")
    signature = signature_from_stderr(CUDA_STDERR)
    expected = Signature("AcceleratorError", 710, "aten::embedding", "index out of bounds")
    assert signature is not None and signature.matches(expected, compare_op=False)


def test_no_traceback_no_signature() -> None:
    assert signature_from_stderr("just a warning\n") is None


def test_flaky_repro_reports_its_rate(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(  # the runs go side by side: the counter is read and bumped under a lock
        "import fcntl, pathlib\n"
        "with open(pathlib.Path(__file__).with_name('count'), 'a+') as f:\n"
        "    fcntl.flock(f, fcntl.LOCK_EX)\n"
        "    f.seek(0)\n"
        "    n = int(f.read() or 0)\n"
        "    f.seek(0)\n"
        "    f.truncate()\n"
        "    f.write(str(n + 1))\n"
        "if n % 2 == 0:\n"
        "    raise IndexError('index out of range in self')\n"
    )
    expected = Signature("IndexError", None, "aten::embedding", "index out of range in self")
    verification = verify(script, expected, runs=3, timeout=60)
    assert (verification.runs, verification.reproduced) == (3, 2)
    assert verification.exit_code == ExitCode.FLAKY
    assert verify(script, Signature("ValueError", None, None, "x"), runs=1).exit_code == (
        ExitCode.NOT_REPRODUCED
    )


def test_a_hanging_repro_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text("import time\ntime.sleep(600)\n")
    verification = verify(script, Signature("IndexError", None, None, "x"), runs=1, timeout=1)
    assert verification.outcomes[0].returncode is None
    assert verification.reproduced == 0


def test_runs_in_interpreters_started_ahead_fail_as_plain_runs_do(tmp_path: Path) -> None:
    """The captured call's verification uses interpreters that imported torch while the
    shrink ran: same signature, the exception printed by the interpreter, one run each."""
    from reprocut.check.plainrun import Standbys

    script = tmp_path / "repro.py"
    script.write_text(
        "import sys\n"
        "print('torch ahead:', 'torch' in sys.modules, file=sys.stderr)\n"
        "import torch\n"
        "torch.nn.functional.embedding(torch.tensor([9]), torch.zeros(4, 2))\n"
    )
    expected = Signature("IndexError", None, None, "index out of range in self")
    standbys = Standbys(2)
    try:
        warm = standbys.take()
        assert standbys.take() == []  # handed out once
        result = verify(script, expected, runs=3, timeout=120, standbys=warm)
    finally:
        standbys.close()
    assert (result.runs, result.reproduced) == (3, 3)
    ahead = ["torch ahead: True" in outcome.stderr_tail for outcome in result.outcomes]
    assert sorted(ahead) == [False, True, True]  # two started ahead, the third a fresh python
