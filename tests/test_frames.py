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
