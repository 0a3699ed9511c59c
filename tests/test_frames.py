"""The one stack walk a GPU snapshot takes finds what the three separate lookups found."""

import os
import sys

import torch

from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.loops import LoopCounters

TORCH_DIR = os.path.dirname(torch.__file__)
# a function whose code says it is torch's, calling back into user code as torch's own do
LIBRARY = compile(
    "def public_api(x, callback):\n    return callback()\n",
    os.path.join(TORCH_DIR, "nn", "reprocut_test_public.py"),
    "exec",
)


def test_one_walk_finds_the_source_call_site_loop_counters_and_public_frame():
    frames = UserFrames()
    loops = LoopCounters(frames)
    namespace: dict = {}
    exec(LIBRARY, namespace)
    seen = []

    def probe():
        frame = sys._getframe(1)  # inside the library function, as a kernel would be
        view = frames.view(frame)
        seen.append((view, frames.find(frame), frames.call_site(frame), loops.read(frame)))

    for epoch in range(2):  # noqa: B007 (read from the frame, as LoopCounters does)
        for step in range(3):
            namespace["public_api"](step, probe)
    view, source, call_site, counters = seen[-1]
    assert view.source() == source and source.line > 0
    assert source.file == __file__ and source.function.startswith("test_one_walk")
    assert view.call_site() == call_site == source
    assert loops.from_view(view.user) == counters == {"epoch": 1, "step": 2}
    assert view.library is not None and view.library.f_code.co_name == "public_api"
    assert view.library.f_locals["x"] == 2


def test_no_user_frame_means_no_source_and_no_public_frame():
    frames = UserFrames()
    namespace: dict = {}
    exec(LIBRARY, namespace)
    view = namespace["public_api"](0, lambda: frames.view(None))
    assert view.source() is None and view.library is None and view.user == []


def _kernel_launch():
    raise IndexError("row id 18 is past the table")  # the op's implementation


def _model_line(ids):
    return LIBRARY_CALL(ids, _kernel_launch)  # the model calls the op


# a dispatcher between the user's call and the op's implementation, as torch's is
LIBRARY_CALL = {}
exec(LIBRARY, LIBRARY_CALL)
LIBRARY_CALL = LIBRARY_CALL["public_api"]


def _formatted_traceback() -> str:
    import traceback

    try:
        LIBRARY_CALL(None, lambda: _model_line([3, 18]))
    except IndexError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        return "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    raise AssertionError("no error")


def test_the_user_frames_of_a_traceback_and_the_deepest_below_a_call():
    from reprocut.model.case import SourceLocation
    from reprocut.record.inside.frames import deepest_below, user_frames_in

    frames = user_frames_in(_formatted_traceback())
    names = [(f.function, f.text.split("  #")[0]) for f in frames]
    assert names[-3:] == [
        ("<lambda>", "LIBRARY_CALL(None, lambda: _model_line([3, 18]))"),
        ("_model_line", "return LIBRARY_CALL(ids, _kernel_launch)"),
        ("_kernel_launch", 'raise IndexError("row id 18 is past the table")'),
    ]  # torch's frames (the library function) are not the user's
    call, launch = frames[-2], frames[-1]
    assert deepest_below(frames, SourceLocation(call.file, call.line)) == launch
    assert deepest_below(frames, SourceLocation(launch.file, launch.line)) is None
    assert deepest_below(frames, SourceLocation(call.file, 1)) is None  # not on the stack


def test_a_custom_ops_failure_shows_the_line_inside_its_implementation(tmp_path):
    """tests/scripts/custom_op: `demo::gather_rows` (ops.py) raises inside its implementation;
    the model calls it at train.py:12. The panel showed the call, and "without blocking, the
    error surfaced at ops.py:12 (CUDA reports errors asynchronously)", on the CPU."""
    import json
    from pathlib import Path

    from rich.console import Console

    from reprocut.cli import main
    from reprocut.localize.launch import op_launch
    from reprocut.model.recording import Failure
    from reprocut.report.display.failure import failure_panel

    script = Path(__file__).parent / "scripts" / "custom_op" / "train.py"
    assert main(["record", "--json", "--quiet", "--root", str(tmp_path), str(script)]) == 0
    run = next((tmp_path / "runs").iterdir())
    failure = Failure.from_json(json.loads((run / "failure.json").read_text()))
    assert failure.op == "demo::gather_rows"
    assert failure.source is not None and failure.launch is not None
    assert (Path(failure.source.file).name, failure.source.line) == ("train.py", 12)
    ops = script.parent / "ops.py"
    raise_line = (
        ops.read_text()
        .splitlines()
        .index(
            '        raise IndexError(f"row id {top} is past the table\'s {table.shape[0]} rows")'
        )
        + 1
    )
    assert (failure.launch.file, failure.launch.line) == (str(ops), raise_line)
    console = Console(record=True, width=200)
    console.print(failure_panel(failure, run))
    shown = console.export_text()
    cwd = Path(failure.cwd)
    shown_ops, shown_script = ops.relative_to(cwd), script.relative_to(cwd)  # as the panel shows
    assert f"your code: {shown_ops}:{raise_line} (inside demo::gather_rows)" in shown
    assert f"called from {shown_script}:12  rows = gather_rows(table.detach(), ids)" in shown
    assert "without blocking" not in shown and "asynchronously" not in shown
    # an aten op's call has no implementation of the user's below it
    outcome = json.loads((run / "record.outcome.json").read_text())
    culprit = dict(outcome["culprit"], op="aten::index_select")
    assert op_launch(culprit, outcome) is None
    assert op_launch(outcome["culprit"], outcome) == failure.launch


def test_a_custom_ops_launch_under_compile_is_the_launch_its_registered_function_writes():
    """Under torch.compile the graph launches a triton_op's kernel itself: no frame of the
    user's passes below the model's call. The launch is then the one the function registered
    as the op writes (corpus/cuda_triton_op_compiled: kernels.py's `wrap_triton(...)[grid]`);
    an op with no Python launch (a C++ extension's) has none."""
    from pathlib import Path

    from reprocut.localize.launch import op_launch

    corpus = Path(__file__).parents[1] / "corpus"
    script = corpus / "cuda_triton_op_compiled" / "train.py"
    line = next(
        k
        for k, text in enumerate(script.read_text().splitlines(), 1)
        if "reprocut: culprit" in text
    )
    culprit = {"op": "fused::gated", "source": {"file": str(script), "line": line}}
    launch = op_launch(culprit, {"traceback": ""})  # compiled: no user frame below the call
    assert launch is not None and Path(launch.file).name == "kernels.py"
    assert "wrap_triton(gated_kernel)" in launch.text and launch.function == "gated"
    extension = corpus / "cuda_extension_exit_guard" / "train.py"
    built = {"op": "clippool::segment_sum", "source": {"file": str(extension), "line": 1}}
    assert op_launch(built, {"traceback": ""}) is None
