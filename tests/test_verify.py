"""Verification by plain `python repro.py` runs, and reading a signature back from a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprocut.check.verify import RunOutcome, run_plain, signature_from_stderr, verify
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


@pytest.mark.parametrize(
    ("code", "qualifies"),
    [
        ("import torch\nx = torch.zeros(2)\n", True),
        ('"""A reduced script."""\n\n# a comment\nimport torch\nimport os\n', True),
        ("import torch; import os\n", True),  # the first statement is still `import torch`
        ("import os\nos.environ['CUDA_LAUNCH_BLOCKING'] = '1'\nimport torch\n", False),
        ("x = 1\n", False),
        ("", False),
        ("import torch.nn\n", False),
        ("from torch import nn\n", False),
        ("import torch as t\n", False),
        ("import torch, os\n", False),
        ("from __future__ import annotations\nimport torch\n", False),
        ('"""doc"""\n"""not a docstring"""\nimport torch\n', False),
        ("import torch\n    broken(\n", False),  # does not parse
    ],
)
def test_which_scripts_start_by_importing_torch(code: str, qualifies: bool) -> None:
    """Only a first statement (after the docstring) of exactly `import torch` lets an
    interpreter that imported torch ahead run the script as `python script` would."""
    from reprocut.check.plainrun import starts_by_importing_torch

    assert starts_by_importing_torch(code) is qualifies


SEEN = (
    "import json, os, sys\n"
    "ahead = sys.orig_argv[1:2] == ['-c']  # python -c STANDBY, not python repro.py\n"
    "seen = [sys.argv, os.getcwd(), sys.path[0], __name__, __file__]\n"
    "print('seen:', json.dumps(seen), 'ahead:', ahead, file=sys.stderr)\n"
)


def _seen(outcome: RunOutcome) -> tuple[str, bool]:
    """What the script saw (argv, cwd, sys.path[0], __name__, __file__), and whether it ran in
    an interpreter started ahead."""
    line = next(line for line in outcome.stderr_tail.splitlines() if line.startswith("seen:"))
    seen, ahead = line.removeprefix("seen: ").rsplit(" ahead: ", 1)
    return seen, ahead == "True"


def _verified_in(ahead, script: Path, expected: Signature, runs: int):
    """`script`'s verification in the two interpreters `ahead` hands it (they must), then the
    rest ended."""
    try:
        warm = ahead.standbys_for(script)
        assert len(warm) == 2
        return verify(script, expected, runs=runs, timeout=120, standbys=warm)
    finally:
        ahead.plain.close()


def test_a_script_repro_that_starts_by_importing_torch_runs_in_interpreters_started_ahead(
    tmp_path: Path,
) -> None:
    """A script reduction's repro (the user's code, cut down) whose first statement is `import
    torch` runs in the interpreters started ahead, and sees what `python repro.py` shows it:
    the same argv, folder, sys.path[0], __name__ and __file__, and fails the same way."""
    from reprocut.check.plainrun import Standbys
    from reprocut.pipeline.ahead import Ahead

    folder = tmp_path / "out"
    folder.mkdir()
    script = folder / "repro.py"
    script.write_text(
        '"""Reduced from train.py."""\n\nimport torch\n'
        + SEEN
        + "torch.nn.functional.embedding(torch.tensor([9]), torch.zeros(4, 2))\n"
    )
    expected = Signature("IndexError", None, None, "index out of range in self")
    result = _verified_in(Ahead(plain=Standbys(2, cwd=folder)), script, expected, runs=3)
    assert (result.runs, result.reproduced) == (3, 3)
    seen = [_seen(outcome) for outcome in result.outcomes]
    assert sorted(ahead for _, ahead in seen) == [False, True, True]  # the third: plain python
    plain = run_plain(script, timeout=120)
    assert {what for what, _ in seen} == {_seen(plain)[0]}  # every run saw what a plain one does
    assert _seen(plain)[1] is False


def test_a_script_repro_that_sets_the_environment_first_runs_plain(tmp_path: Path) -> None:
    """A repro that sets the environment before importing torch (CUDA reads it when torch
    starts it) gets no interpreter started ahead: they are ended, and every run is plain."""
    from reprocut.check.plainrun import Standbys
    from reprocut.pipeline.ahead import Ahead

    script = tmp_path / "repro.py"
    script.write_text(
        "import os\nos.environ['REPROCUT_TEST_FLAG'] = '1'\nimport torch\n"
        + SEEN
        + "raise IndexError('index out of range in self')\n"
    )
    standbys = Standbys(2, cwd=tmp_path)
    waiting = [standby.process for standby in standbys._waiting]
    assert Ahead(plain=standbys).standbys_for(script) == ()
    assert all(process.poll() is not None for process in waiting)  # ended, not left waiting
    assert standbys.take() == []
    expected = Signature("IndexError", None, None, "index out of range in self")
    result = verify(script, expected, runs=2, timeout=120, standbys=())
    assert result.reproduced == 2
    assert [_seen(outcome)[1] for outcome in result.outcomes] == [False, False]


@pytest.mark.parametrize(
    ("code", "warm"),
    [
        ("import torch\nimport numpy as np\nimport cupy\n", ("numpy", "cupy")),
        (
            "import torch\nimport triton\nimport triton.language as tl\n",
            ("triton", "triton.language"),
        ),
        (
            "import torch\n@torch.library.custom_op('x::f', mutates_args=())\ndef f(x): ...\n",
            ("torch._dynamo",),
        ),
        ("import torch\nimport os\nos.environ['TORCH_LOGS'] = 'dynamo'\nimport numpy\n", ()),
        ("import torch\ndef f():\n    import numpy\n", ()),  # not at its top: maybe never
        ("import torch\nimport scipy\n", ()),  # not a module the fork server trusts either
        ("import torch\n    broken(\n", ()),
    ],
)
def test_what_the_verifications_interpreters_may_import_ahead(code: str, warm: tuple) -> None:
    from reprocut.check.plainrun import runs_warm, warm_modules

    assert warm_modules(code) == warm
    runs = code.startswith("import torch\n") and "broken" not in code
    assert runs_warm(code, warm) is runs
    assert runs_warm(code, ("numpy",)) is ("numpy" in warm)


def test_interpreters_that_imported_more_run_only_the_repros_that_import_it_too(
    tmp_path: Path,
) -> None:
    """Started to import numpy after torch (the repro imports it next), the interpreters run a
    repro that does, which sees what `python repro.py` shows it; one that does not import numpy
    runs in fresh interpreters, and they are ended."""
    from reprocut.check.plainrun import Standbys
    from reprocut.pipeline.ahead import Ahead

    script = tmp_path / "repro.py"
    script.write_text(
        "import torch\nimport numpy\n"
        + SEEN
        + "raise IndexError(str(numpy.array(['index out of range in self'])[0]))\n"
    )
    expected = Signature("IndexError", None, None, "index out of range in self")
    ahead = Ahead(plain=Standbys(2, cwd=tmp_path, warm=("numpy",)))
    result = _verified_in(ahead, script, expected, runs=2)
    assert result.reproduced == 2 and all(_seen(o)[1] for o in result.outcomes)
    assert {_seen(o)[0] for o in result.outcomes} == {_seen(run_plain(script, timeout=120))[0]}
    without = tmp_path / "without.py"
    without.write_text("import torch\n" + SEEN + "raise IndexError('index out of range')\n")
    standbys = Standbys(2, cwd=tmp_path, warm=("numpy",))
    assert Ahead(plain=standbys).standbys_for(without) == () and standbys.take() == []
