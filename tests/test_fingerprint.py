"""A memory fault's fingerprint from real memcheck reports, two compared, and the walk-back to
the last accepted candidate whose fingerprint is the original's."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from reprocut.check.fingerprint import UNAVAILABLE, compare, memory_fingerprint
from reprocut.check.memcheck import TensorRange, parse_report
from reprocut.check.sanitizer import Evidence
from reprocut.model.case import Signature
from reprocut.model.fingerprint import (
    BEFORE_START,
    MISALIGNED,
    PAST_END,
    MemoryFingerprint,
    kernel_key,
)
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.pipeline.cases import Outcome
from reprocut.pipeline.same_bug import walk_back_to_fingerprint
from reprocut.shrink.walkback import AcceptedLog

FIXTURES = Path(__file__).parent / "fixtures"
ILLEGAL = Signature("RuntimeError", 700, None, "an illegal memory access was encountered")


def evidence(name: str, tensors: tuple[TensorRange, ...] = (), text: str | None = None) -> Evidence:
    report = parse_report(text if text is not None else (FIXTURES / name).read_text())
    return Evidence("found", report=report, tensors=tensors)


def test_a_triton_read_past_the_end_of_its_bias() -> None:
    base = 0x7F2A3C000200
    bias = TensorRange("bias", base, 512, base, position=1)
    found = memory_fingerprint(evidence("memcheck_triton_oob.log", (bias,)), op=None)
    assert found == MemoryFingerprint(
        "add_cond_kernel", "read", 4, PAST_END, "`bias` (arg 1)", accesses=("read",)
    )
    assert found.describe() == "read of 4 B in add_cond_kernel, past the end of `bias` (arg 1)"
    unnamed = memory_fingerprint(evidence("memcheck_triton_oob.log"), op=None)
    assert unnamed is not None and unnamed.target == "an allocation of 512 B"
    assert MemoryFingerprint.from_json(found.to_json()) == found


def test_a_misaligned_vector_read_and_an_aten_kernel_named_by_its_op() -> None:
    misaligned = memory_fingerprint(evidence("memcheck_misaligned.log"), op=None)
    assert misaligned is not None
    assert (misaligned.kernel, misaligned.size, misaligned.relation) == (
        "cmvn_vec4",
        16,
        MISALIGNED,
    )
    report = parse_report((FIXTURES / "memcheck_index_select_old.log").read_text())
    address = report.errors[0].address
    weight = TensorRange("weight", address + 4096, 4096, address + 4096)
    aten = memory_fingerprint(
        evidence("memcheck_index_select_old.log", (weight,)), "aten::index_select"
    )
    assert aten is not None and (aten.kernel, aten.relation) == ("aten::index_select", BEFORE_START)
    assert not aten.by_kernel and "size" not in aten.compared()
    assert (
        kernel_key(report.errors[0].kernel)
        == "at::native::(anonymous namespace)::indexSelectSmallIndex"
    )


def test_the_same_fault_matches_and_another_one_with_the_same_error_code_does_not() -> None:
    original = evidence("memcheck_triton_oob.log")
    same = compare(original, evidence("memcheck_triton_oob.log"), op=None)
    assert same.equal is True and same.differ == () and same.skipped == ()
    text = (FIXTURES / "memcheck_triton_oob.log").read_text()
    # the same overrun, nearer the next allocation: memcheck calls it "before the start" of that
    # one; the side follows the layout, the class (out of bounds) is compared
    before = evidence("", text=text.replace("bytes after the nearest", "bytes before the nearest"))
    layout = compare(original, before, op=None)
    assert layout.equal is True and layout.repro["relation"] == BEFORE_START
    misaligned = evidence("", text=text.replace("is out of bounds", "is misaligned"))
    slid = compare(original, misaligned, op=None)
    assert slid.equal is False and slid.differ == ("relation",)
    other = compare(original, evidence("memcheck_misaligned.log"), op=None)
    assert other.equal is False and other.differ == ("kernel", "relation")
    assert other.verdict() == (
        "no: the kernel differs; the address relation differs; same access; "
        "the access size differs (4 B, then 16 B)"
    )
    assert f"**{other.verdict()}**" in other.markdown()
    assert other.to_json()["original"]["text"].startswith("read of 4 B in add_cond_kernel")


def test_reports_from_the_h200_read_past_the_end_before_the_start_and_a_slid_write() -> None:
    """Real memcheck text of four repros on the H200 (CUDA 13)."""
    hashed = memory_fingerprint(evidence("memcheck_h200_cupy_hashed_ids.log"), op=None)
    assert hashed is not None
    assert (hashed.kernel, hashed.access, hashed.relation) == ("hashed_bag", "read", PAST_END)
    wrapped = memory_fingerprint(evidence("memcheck_h200_triton_int32_offsets.log"), op=None)
    assert wrapped is not None
    assert (wrapped.kernel, wrapped.access, wrapped.size, wrapped.relation) == (
        "scale_logits_kernel",
        "write",
        16,
        BEFORE_START,
    )
    bias = memory_fingerprint(evidence("memcheck_h200_triton_expand_bias.log"), op=None)
    assert bias is not None and (bias.kernel, bias.size) == ("add_cond_kernel", 16)
    # the same Triton read vectorized 4 B wide in another run is the same bug
    assert compare(evidence("memcheck_triton_oob.log"),
                   evidence("memcheck_h200_triton_expand_bias.log"), op=None).equal  # fmt: skip
    # the contiguous-pe repro writes past `out`: the original read past `pe`, same kernel
    original = (
        (FIXTURES / "memcheck_h200_cupy_contiguous_pe.log").read_text().replace("write", "read")
    )
    slid = compare(
        evidence("", text=original), evidence("memcheck_h200_cupy_contiguous_pe.log"), op=None
    )
    assert slid.equal is False and slid.differ == ("access",)


def test_without_compute_sanitizer_the_fingerprint_is_not_checked() -> None:
    missing = Evidence("unavailable", "compute-sanitizer is not on PATH")
    verdict = compare(missing, missing, op=None)
    assert verdict.equal is None and verdict.skipped == (UNAVAILABLE,)
    assert "not checked" in verdict.markdown()
    no_address = evidence("", text="========= Invalid __global__ write of size 8 bytes\n"
                          "=========     at scatter_rows+0x10\n========= ERROR SUMMARY: 1 error\n")  # fmt: skip
    partial = compare(no_address, no_address, op=None)
    assert partial.equal is True and partial.skipped == ("relation: not reported by memcheck",)


STAND_IN = """\
#!{python}
# compute-sanitizer's stand-in: runs nothing, and writes as its report the memcheck log named
# by the program's `# memcheck:` line (a real report kept in tests/fixtures).
import sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
program = args[args.index("-c") + 2]
name = next(l.split(":", 1)[1].strip() for l in open(program) if l.startswith("# memcheck:"))
open(log, "w").write(open({fixtures!r} + "/" + name).read())
"""

CANDIDATE = """\
# memcheck: {log}
raise RuntimeError("CUDA error: an illegal memory access was encountered")
"""


def test_walk_back_to_the_last_candidate_whose_fingerprint_matches(tmp_path, monkeypatch) -> None:
    """Candidates 0-2 read past the end of the bias (the original's fault); 3-4 slid to a
    misaligned read, error 700 alike: the repro becomes candidate 2."""
    tools = tmp_path / "bin"
    tools.mkdir()
    tool = tools / "compute-sanitizer"
    tool.write_text(STAND_IN.format(python=sys.executable, fixtures=str(FIXTURES)))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tools}:{Path(sys.executable).parent}")
    out = tmp_path / "out"
    log = AcceptedLog(out / "accepted")
    logs = ["memcheck_triton_oob.log"] * 3 + ["memcheck_misaligned.log"] * 2
    for index, name in enumerate(logs):
        log.add_code(CANDIDATE.format(log=name) + f"# candidate {index}\n")
    (out / "repro.py").write_text(log.entries[-1].path.read_text())
    target = memory_fingerprint(evidence("memcheck_triton_oob.log"), op=None)
    assert target is not None
    failure = Failure("outside-dispatcher", ErrorInfo("RuntimeError", "illegal"), ILLEGAL)
    outcome = Outcome(code="", statements=1, tensor_elements=None, checks=5, sidecar=False)
    probes: dict[Path, Evidence] = {}
    chosen, verified, walked = walk_back_to_fingerprint(
        log, outcome, failure, target, render=lambda case, inputs: ("", ()), inputs={},
        runs=2, timeout=60, out=out, probes=probes,
    )  # fmt: skip
    assert walked.chosen is not None and walked.chosen.index == 2
    # the chosen candidate's memcheck is kept, so the repro's findings need no second run
    assert probes[walked.chosen.path].status == "found"
    assert verified is not None and verified.reproduced == 2
    assert "# candidate 2" in (out / "repro.py").read_text() == chosen.code


def test_the_unshrunk_script_runs_from_accepted_with_its_sibling_modules(tmp_path) -> None:
    """The walk-back's first probe is the user's script, copied to accepted/: its imports of
    sibling modules still resolve (on the H200 a walk-back stopped at 'the unshrunk candidate
    does not verify' because they did not)."""
    from reprocut.check.verify import run_plain
    from reprocut.source.recorded import with_script_dir_on_path

    project = tmp_path / "project"
    project.mkdir()
    (project / "kernels.py").write_text(
        'def launch():\n    raise RuntimeError("CUDA error: an illegal memory access was encountered")\n'
    )
    script = project / "train.py"
    script.write_text(
        '"""Trains."""\nfrom __future__ import annotations\n\nimport kernels\n\nkernels.launch()\n'
    )
    log = AcceptedLog(tmp_path / "out" / "accepted")
    log.start_source(with_script_dir_on_path(script.read_text(), project))
    seen = run_plain(log.entries[0].path, timeout=60).signature
    assert seen is not None and seen.matches(ILLEGAL, compare_op=False), seen


def test_the_default_runs_to_the_fixed_point_under_the_safety_cap_and_plain_runs_stay_bounded():
    """No --max-time: every reduction runs to its fixed point, the safety cap only a net; the
    plain confirmations keep a bound of their own (a memory fault's captured call runs the
    user's kernel on gigabytes, as a script's candidates do); --max-time stays the user's."""
    from reprocut.model.limits import SAFETY_CAP, SAFETY_CAP_HIT
    from reprocut.pipeline.settings import PLAIN_SECONDS_CASE, PLAIN_SECONDS_SCRIPT, ShrinkSettings

    fault = Failure("localized", ErrorInfo("RuntimeError", "illegal"), ILLEGAL)
    assert_ = Signature("RuntimeError", 710, "aten::embedding", "index out of bounds")
    device_assert = Failure("localized", ErrorInfo("RuntimeError", "assert"), assert_)
    settings = ShrinkSettings()
    assert settings.time_limit().seconds == SAFETY_CAP
    assert settings.time_limit().reason == SAFETY_CAP_HIT
    assert settings.plain_seconds(fault, script=False) == PLAIN_SECONDS_SCRIPT
    assert settings.plain_seconds(device_assert, script=False) == PLAIN_SECONDS_CASE
    assert settings.plain_seconds(device_assert, script=True) == PLAIN_SECONDS_SCRIPT
    user = ShrinkSettings(max_time=7)
    assert (user.time_limit().seconds, user.time_limit().reason) == (7, "max time")
    assert user.plain_seconds(device_assert, script=False) == pytest.approx(7 * 0.2)


def test_the_verdict_says_which_parts_agreed_when_only_the_side_of_the_address_differs() -> None:
    """The original read before the start of `feats`, the repro past the end of `loss`: the
    same overrun of the same kernel, the nearest allocation another one in each run's layout
    (real memcheck text, the side as each run's memcheck measured it)."""
    text = (FIXTURES / "memcheck_triton_oob.log").read_text()
    base = 0x7F2A3C000200
    feats = TensorRange("feats", base, 512, base, position=0)
    loss = TensorRange("loss", base, 512, base)
    before = text.replace("bytes after the nearest", "bytes before the nearest")
    same = compare(evidence("", (feats,), before), evidence("", (loss,), text), op=None)
    assert same.equal is True and same.differ == ()
    assert same.parts == (("kernel", "same"), ("access", "same"), ("size", "same"),
                          ("address", "differs"))  # fmt: skip
    assert same.verdict() == (
        "yes: same kernel and access; the address relation differs "
        "(expected when the allocation layout changes)"
    )
    shown = same.to_json()
    assert shown["parts"] == {"kernel": "same", "access": "same", "size": "same",
                              "address": "differs"}  # fmt: skip
    assert shown["verdict"] == same.verdict() and shown["equal"] is True
    markdown = same.markdown()
    assert (
        "| address relation | before the start of `feats` (arg 0) | past the end of `loss` | differs |"
        in markdown
    )
    assert "| kernel | add_cond_kernel | add_cond_kernel | same |" in markdown
    identical = compare(evidence("", (loss,), text), evidence("", (loss,), text), op=None)
    assert identical.verdict() == "yes: same kernel, access and address relation"


def test_a_misaligned_access_compares_its_size_and_says_so() -> None:
    text = (FIXTURES / "memcheck_misaligned.log").read_text()
    narrower = text.replace("of size 16 bytes", "of size 8 bytes")
    slid = compare(evidence("", text=text), evidence("", text=narrower), op=None)
    assert slid.equal is False and slid.differ == ("size",)
    assert slid.verdict() == "no: the access size differs; same kernel, access and address relation"


def test_a_signatures_parts_from_real_plain_runs(tmp_path: Path) -> None:
    """The error and the kind, as the repro's plain runs showed them; the op they cannot see."""
    from reprocut.check.verify import verify
    from reprocut.model.signature import classify
    from reprocut.pipeline.same_bug import signature_same_bug

    expected = classify("IndexError", "index out of range in self", op="aten::embedding")
    failure = Failure("localized", ErrorInfo("IndexError", "index out of range in self"), expected)
    repro = tmp_path / "repro.py"
    repro.write_text(
        "import torch\ntorch.nn.functional.embedding(torch.tensor([5]), torch.zeros(3, 2))\n"
    )
    same = signature_same_bug(failure, verify(repro, expected, runs=1, timeout=120))
    assert same.equal is True and same.parts == (("error", "same"), ("kind", "same"))
    assert same.verdict() == "yes: same error and kind"
    other = tmp_path / "other.py"
    other.write_text("import torch\ntorch.zeros(3)[torch.tensor([1.5])]\n")
    slid = signature_same_bug(failure, verify(other, expected, runs=1, timeout=120))
    assert slid.equal is False and slid.parts == (("error", "same"), ("kind", "differs"))
    assert slid.verdict() == "no: the kind differs; same error"
