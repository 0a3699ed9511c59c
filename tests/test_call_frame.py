"""Which frame of the failing stack a script reduction cuts to, and the frames it is told of.

A numpy kernel inside an autograd.Function: the innermost frame takes arrays, `forward` takes
`ctx`; the wrapper that calls `Function.apply` takes the tensors, and that is the call the jump
binds and makes. The recorded traceback names the frames without a run of the script.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from reprocut.model.case import Signature, TensorSpec
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.source.call_frame import callable_with, enclosing_function, outer_call_frame
from reprocut.source.launch_specs import LaunchSpecs
from reprocut.source.probe import traceback_frames
from reprocut.source.recorded import _probe_failing_call

SEGMENTS = textwrap.dedent("""
    import numpy as np
    import torch


    def segment_sum(values, segments, count):
        out = np.zeros((count, values.shape[1]), dtype=values.dtype)
        for row in range(values.shape[0]):
            out[segments[row]] += values[row]
        return out


    class SegmentSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, values, segments, count):
            return torch.from_numpy(segment_sum(values.numpy(), segments.numpy(), count))


    def pool(values, segments, count=2):
        return SegmentSum.apply(values, segments, count)


    def main():
        for step in range(3):
            segments = torch.tensor([0, 1, 1 + step // 2])
            pool(torch.ones(3, 4), segments)


    main()
""").lstrip()
LINES = SEGMENTS.splitlines()


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(LINES, start=1) if line.strip() == text)


def test_the_function_around_a_line_and_whether_it_can_be_called(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SEGMENTS)
    kernel = line_of("out[segments[row]] += values[row]")
    forward = line_of("return torch.from_numpy(segment_sum(values.numpy(), segments.numpy(), count))")  # fmt: skip
    wrapper = line_of("return SegmentSum.apply(values, segments, count)")
    found = enclosing_function(script, forward)
    assert found is not None and (found.name, found.top_level) == ("forward", False)
    assert found.params[0] == ("ctx", False)
    assert enclosing_function(script, line_of("main()")) is None  # module level
    spec = TensorSpec((3, 4))
    tensors = LaunchSpecs(params=(("values", spec), ("segments", TensorSpec((3,), dtype="int64"))))
    assert callable_with(script, wrapper, tensors)  # `count` has a default
    assert not callable_with(script, kernel, LaunchSpecs(values=(("count", 2),)))  # arrays
    assert not callable_with(script, forward, tensors)  # ctx
    stack = [(script, line_of("main()")), (script, line_of("pool(torch.ones(3, 4), segments)")),
             (script, wrapper), (script, forward)]  # fmt: skip
    assert outer_call_frame(stack) == (script, wrapper)  # not `forward`, not `main()`


def test_a_recorded_traceback_names_the_frames_while_the_files_still_hold_them(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SEGMENTS)
    wrapper = line_of("return SegmentSum.apply(values, segments, count)")
    text = (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 10, in <module>\n'
        f'  File "{script}", line {wrapper}, in pool\n'
        "    return SegmentSum.apply(values, segments, count)\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "IndexError: index 2 is out of bounds for axis 0 with size 2\n"
    )
    assert traceback_frames(text) == [(script, wrapper)]
    script.write_text(SEGMENTS.replace("def pool(", "# a new line\ndef pool("))
    assert traceback_frames(text) == []  # edited since: the frames are read again


def test_the_jump_target_is_the_wrapper_of_the_numpy_kernel(tmp_path: Path) -> None:
    """One probe run reads the innermost frame (arrays: not callable) and the wrapper around
    it (tensors, a default): the wrapper's call is the focus, with its tensors probed."""
    script = tmp_path / "train.py"
    script.write_text(SEGMENTS)
    message = "index 2 is out of bounds for axis 0 with size 2"
    signature = Signature("IndexError", None, None, "index <n> is out of bounds for axis <n> with size <n>")  # fmt: skip
    failure = Failure("script-error", ErrorInfo("IndexError", message), signature)
    frames = [(script, line_of(text)) for text in (
        "main()", "pool(torch.ones(3, 4), segments)",
        "return SegmentSum.apply(values, segments, count)",
        "return torch.from_numpy(segment_sum(values.numpy(), segments.numpy(), count))",
        "out[segments[row]] += values[row]")]  # fmt: skip
    traceback = "Traceback (most recent call last):\n" + "".join(
        f'  File "{file}", line {line}, in f\n    {LINES[line - 1].strip()}\n'
        for file, line in frames
    )
    focus, launch = _probe_failing_call(
        failure, script, tmp_path, [], {script.resolve()}, traceback
    )
    assert focus == "return SegmentSum.apply(values, segments, count)"
    assert dict(launch.params)["segments"].shape == (3,)
    assert dict(launch.integers)["segments"].high == 2  # the id equal to the count, kept
