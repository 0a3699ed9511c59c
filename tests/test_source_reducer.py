"""The source reducer's loop: pure-Python predicates (fast), then real scripts run by the oracle."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprocut.case import Signature, TensorSpec
from reprocut.errors import NotReproducedError
from reprocut.source_passes import PASSES, PassContext, delete_statements
from reprocut.source_reducer import (
    SourceAccepted,
    SourceChecked,
    SourceReducer,
    format_code,
    reduce_source,
    sort_key,
)

BAD = Signature("ValueError", None, None, "bad value <n>")


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def run_in_process(source: str) -> Signature | None:
    """The candidate's failure, from running it here (these scripts are pure Python, no loops
    that could spin forever)."""
    try:
        exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
    except Exception as exc:
        message = str(exc)
        kind = "bad value <n>" if message.startswith("bad value") else message
        return Signature(type(exc).__name__, None, None, kind)
    return None


SCRIPT = code("""
    import math
    import json

    SCALE = 10


    def normalize(values, scale):
        total = sum(values)
        if total > scale * 3:
            raise ValueError(f"bad value {total}")
        return [v / scale for v in values]


    def summarize(rows):
        return {"mean": sum(rows) / len(rows), "max": max(rows)}


    def main():
        history = []
        for epoch in range(3):
            batch = [epoch * 7, SCALE, 5]
            normalized = normalize(batch, scale=SCALE)
            history.append(summarize(normalized))
            print(json.dumps(history[-1]), math.pi)


    if __name__ == "__main__":
        main()
""")


def reducer_for(source: str, check=run_in_process, **options) -> SourceReducer:
    return SourceReducer(
        best=source, expected=BAD, check=check, context=PassContext(), passes=PASSES, **options
    )


def test_the_loop_reaches_a_small_fixed_point():
    reducer = reducer_for(SCRIPT)
    assert reducer.run() == "fixed point"
    assert run_in_process(reducer.best) == BAD
    assert format_code(reducer.best) == code("""
        total = 0
        raise ValueError(f"bad value {total}")
    """)


def test_the_failing_call_is_kept_when_focused():
    reducer = SourceReducer(
        best=SCRIPT,
        expected=BAD,
        check=run_in_process,
        context=PassContext(focus="normalized = normalize(batch, scale=SCALE)"),
    )
    reducer.run()
    assert "normalize(" in reducer.best
    assert "def normalize" in reducer.best
    assert run_in_process(reducer.best) == BAD
    assert format_code(reducer.best) == code("""
        def normalize(values, scale):
            total = 0
            raise ValueError(f"bad value {total}")


        normalize(0, scale=0)
    """)


def test_another_failure_is_never_accepted():
    seen: list[Signature | None] = []

    def check(source: str) -> Signature | None:
        seen.append(run_in_process(source))
        return seen[-1]

    reducer = reducer_for(SCRIPT, check=check)
    reducer.run()
    assert run_in_process(reducer.best) == BAD
    others = {s.error_type for s in seen if s is not None and s != BAD}
    assert "NameError" in others  # candidates that drifted to another bug were tried, and refused


def test_consider_runs_nothing_for_a_candidate_that_is_not_smaller():
    calls: list[str] = []

    def check(source: str) -> Signature | None:
        calls.append(source)
        return BAD

    reducer = reducer_for(SCRIPT, check=check)
    assert not reducer.consider(SCRIPT)
    assert not reducer.consider(SCRIPT + "x = 1\n")
    assert calls == []
    smaller = SCRIPT.replace("import math\n", "")
    assert reducer.consider(smaller)
    assert not reducer.consider(smaller)  # seen: no second run
    assert calls == [smaller]


def test_every_accepted_candidate_is_reported_and_strictly_smaller():
    events: list[object] = []
    reducer = reducer_for(SCRIPT, on_event=events.append)
    reducer.run()
    accepted = [e for e in events if isinstance(e, SourceAccepted)]
    keys = [sort_key(SCRIPT), *(sort_key(e.code) for e in accepted)]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)
    assert accepted[-1].code == reducer.best
    assert sum(isinstance(e, SourceChecked) for e in events) == reducer.checks


def test_the_budget_stops_the_loop():
    reducer = reducer_for(SCRIPT, max_checks=3)
    assert reducer.run() == "max checks"
    assert reducer.checks == 3


def test_sort_key_prefers_one_file_then_flat_code(tmp_path: Path):
    (tmp_path / "helpers.py").write_text("X = 1\n")
    dirs = (tmp_path,)
    assert sort_key("X = 1\nprint(X)\n", dirs) < sort_key("from helpers import X\n", dirs)
    flat = "x = next(iter(range(3)))\nprint(x)\nprint(x)\n"
    loop = "for x in range(3):\n    print(x)\n"
    assert sort_key(flat) < sort_key(loop)
    assert sort_key("n = 2\n") < sort_key("n = 64\n")


def test_reduce_source_refuses_a_script_that_does_not_fail(tmp_path: Path):
    script = tmp_path / "ok.py"
    script.write_text("print('fine')\n")
    with pytest.raises(NotReproducedError):
        reduce_source(
            script, cwd=tmp_path, argv=[], expected=BAD, check=run_in_process, passes=PASSES
        )


def test_reduce_source_formats_the_result(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("import os\nx=[1,2]\nif x:\n    raise ValueError('bad value %d'%x[0])\n")
    result = reduce_source(
        script,
        cwd=tmp_path,
        argv=[],
        expected=BAD,
        check=run_in_process,
        passes=[delete_statements],
    )
    assert result.code == 'x = [1, 2]\nif x:\n    raise ValueError("bad value %d" % x[0])\n'
    assert result.lines == 3
    assert result.original_lines == 4
    assert result.accepted == (("delete_statements", 1),)
    assert result.stopped == "fixed point"


# --- real scripts, run by the oracle ---------------------------------------------------------

HELPERS = code('''
    """Data utilities shared by the training scripts."""

    import torch

    PAD = 0


    def make_vocab(words):
        return {word: index + 1 for index, word in enumerate(sorted(set(words)))}


    def encode(sentence, vocab):
        return [vocab.get(word, PAD) for word in sentence.split()]


    def pad_batch(rows, width):
        """Pad token rows to `width`: the attention kernel we ship needs a fixed width."""
        padded = []
        for row in rows:
            if len(row) > width:
                raise ValueError(f"sequence of {len(row)} tokens does not fit width {width}")
            padded.append(row + [PAD] * (width - len(row)))
        return torch.tensor(padded)


    def warmup_lr(step, base, warmup):
        return base * min(1.0, (step + 1) / warmup)
''')

TRAIN_CLASSIFIER = code('''
    """Train a bag-of-words classifier on a synthetic corpus."""

    import argparse
    import random

    import torch
    from torch import nn

    from helpers import encode, make_vocab, pad_batch, warmup_lr

    WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


    class Classifier(nn.Module):
        def __init__(self, vocab_size, dim, classes):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, dim)
            self.head = nn.Linear(dim, classes)

        def forward(self, tokens):
            hidden = self.embed(tokens).mean(dim=1)
            return self.head(hidden)


    def make_corpus(n, seed):
        rng = random.Random(seed)
        sentences = []
        for i in range(n):
            length = 3 + i % 5 + (12 if i == 37 else 0)  # one long review in the data
            sentences.append(" ".join(rng.choice(WORDS) for _ in range(length)))
        return sentences


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=2)
        parser.add_argument("--batch-size", type=int, default=8)
        args = parser.parse_args()

        torch.manual_seed(0)
        sentences = make_corpus(64, seed=1)
        vocab = make_vocab(word for sentence in sentences for word in sentence.split())
        model = Classifier(len(vocab) + 1, 32, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = nn.CrossEntropyLoss()

        step = 0
        for epoch in range(args.epochs):
            for start in range(0, len(sentences), args.batch_size):
                rows = [encode(s, vocab) for s in sentences[start : start + args.batch_size]]
                tokens = pad_batch(rows, width=12)
                labels = torch.tensor([len(row) % 4 for row in rows])
                for group in optimizer.param_groups:
                    group["lr"] = warmup_lr(step, 0.1, 10)
                loss = loss_fn(model(tokens), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step % 5 == 0:
                    print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
        print("done")


    if __name__ == "__main__":
        main()
''')

FUSED_EXTENSION = code('''
    """A fused bias + GELU "kernel": a numpy stand-in for a compiled CUDA extension.

    Like the real kernel it walks each input's memory as a flat, contiguous buffer and never looks
    at strides, so a view whose storage is smaller than its element count (an expand()ed tensor)
    makes it read past the end of the buffer: on a GPU an illegal memory access, here an error.
    """

    import math

    import numpy as np
    import torch

    BLOCK = 128


    def _flat_buffer(tensor):
        storage = torch.empty(0, dtype=tensor.dtype).set_(tensor.untyped_storage())
        return storage[tensor.storage_offset() :].numpy()


    def fused_bias_gelu(x, bias):
        n = x.numel()
        xs, bs = _flat_buffer(x.detach()), _flat_buffer(bias.detach())
        for buffer in (xs, bs):
            if buffer.size < n:
                raise RuntimeError(
                    f"fused_bias_gelu: illegal memory access (read {n} elements from a buffer of {buffer.size})"
                )
        out = np.empty(n, dtype=xs.dtype)
        for start in range(0, n, BLOCK):
            block = xs[start : start + BLOCK] + bs[start : start + BLOCK]
            out[start : start + BLOCK] = 0.5 * block * (1 + np.tanh(math.sqrt(2 / math.pi) * block))
        return torch.from_numpy(out).view(x.shape)
''')

TRAIN_FUSED_MLP = code('''
    """Train a small MLP whose hidden layer uses our fused bias + GELU kernel at evaluation."""

    import argparse
    import os
    import sys

    import torch
    from torch import nn

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
    from fusedext import fused_bias_gelu  # noqa: E402  (our compiled extension)


    class FusedMLP(nn.Module):
        def __init__(self, dim_in, hidden, dim_out):
            super().__init__()
            self.proj = nn.Linear(dim_in, hidden, bias=False)
            self.bias = nn.Parameter(torch.zeros(hidden))
            self.out = nn.Linear(hidden, dim_out)

        def forward(self, x):
            hidden = self.proj(x)
            if self.training:
                hidden = torch.nn.functional.gelu(hidden + self.bias)
            else:
                out = fused_bias_gelu(hidden, self.bias.expand_as(hidden))
                hidden = out
            return self.out(hidden)


    def batches(n, batch_size, dim):
        generator = torch.Generator().manual_seed(0)
        for _ in range(n):
            x = torch.randn(batch_size, dim, generator=generator)
            y = (x.sum(dim=1) > 0).long()
            yield x, y


    def evaluate(model, data):
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in data:
                correct += (model(x).argmax(dim=1) == y).sum().item()
                total += len(y)
        model.train()
        return correct / total


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=3)
        parser.add_argument("--hidden", type=int, default=64)
        args = parser.parse_args()

        model = FusedMLP(32, args.hidden, 2)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for epoch in range(args.epochs):
            for x, y in batches(20, 16, 32):
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            accuracy = evaluate(model, batches(4, 16, 32))
            print(f"epoch {epoch}: accuracy {accuracy:.2f}")


    if __name__ == "__main__":
        main()
''')


def run_python(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_an_error_in_a_sibling_helper_reduces_to_one_small_file(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "helpers.py").write_text(HELPERS)
    script = project / "train.py"
    script.write_text(TRAIN_CLASSIFIER)
    expected = Signature("ValueError", None, None, "sequence of <n> tokens does not fit width <n>")
    result = reduce_source(
        script,
        cwd=project,
        argv=["--epochs", "2"],
        expected=expected,
        focus="tokens = pad_batch(rows, width=12)",
        max_time=300,
    )
    assert "import helpers" not in result.code and "from helpers" not in result.code
    assert "def pad_batch" in result.code  # the helper that failed is kept, not re-raised by hand
    assert result.lines <= 12 < result.original_lines
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "repro.py").write_text(result.code)
    done = run_python(alone / "repro.py", alone)
    assert "ValueError: sequence of" in done.stderr and "does not fit width" in done.stderr


@pytest.mark.slow
def test_a_stride_ignoring_kernel_keeps_its_expanded_input(tmp_path: Path):
    project = tmp_path / "project"
    (project / "vendor").mkdir(parents=True)
    (project / "vendor" / "fusedext.py").write_text(FUSED_EXTENSION)
    script = project / "train.py"
    script.write_text(TRAIN_FUSED_MLP)
    expected = Signature(
        "RuntimeError",
        None,
        None,
        "fused_bias_gelu: illegal memory access (read <n> elements from a buffer of <n>)",
    )
    specs = [TensorSpec((16, 64)), TensorSpec((16, 64), (0, 1))]  # as recorded at the launch
    result = reduce_source(
        script,
        cwd=project,
        argv=[],
        expected=expected,
        specs=specs,
        focus="out = fused_bias_gelu(hidden, self.bias.expand_as(hidden))",
        max_time=300,
    )
    assert "as_strided((16, 64), (0, 1)" in result.code  # the expanded view stays expanded
    assert "class FusedMLP" not in result.code and "optimizer" not in result.code
    assert result.lines <= 8 < result.original_lines
    repro = project / "repro.py"
    repro.write_text(result.code)
    done = run_python(repro, project)
    assert "RuntimeError: fused_bias_gelu: illegal memory access" in done.stderr


# --- on the H200 -----------------------------------------------------------------------------

TRITON_TRAIN = code('''
    """Train an MLP whose bias add is a hand-written Triton kernel that ignores strides."""

    import torch
    import triton
    import triton.language as tl
    from torch import nn


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)  # assumes y is contiguous like x
        tl.store(out_ptr + offsets, x + y, mask=mask)


    def triton_add(x, y):
        out = torch.empty_like(x)
        n = out.numel()
        add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out


    class BiasMLP(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.proj = nn.Linear(dim, hidden, bias=False)
            self.bias = nn.Parameter(torch.zeros(hidden))
            self.head = nn.Linear(hidden, 1)

        def forward(self, x):
            h = self.proj(x)
            h = triton_add(h, self.bias.expand_as(h))  # the bias is a stride-0 view
            return self.head(torch.relu(h))


    def main():
        torch.manual_seed(0)
        model = BiasMLP(256, 8192).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        for step in range(5):
            x = torch.randn(4096, 256, device="cuda")
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(step, loss.item())


    if __name__ == "__main__":
        main()
''')


@pytest.mark.cuda
@pytest.mark.slow
def test_triton_stride_fault_reduces_to_a_short_script(tmp_path: Path):
    script = tmp_path / "train_triton.py"
    script.write_text(TRITON_TRAIN)
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    first = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert "illegal memory access" in first.stderr, first.stderr[-2000:]
    expected = Signature("RuntimeError", 700, None, "an illegal memory access was encountered")
    specs = [
        TensorSpec((4096, 8192), device="cuda:0"),
        TensorSpec((4096, 8192), (0, 1), device="cuda:0"),
        TensorSpec((4096, 8192), device="cuda:0"),
    ]
    result = reduce_source(
        script,
        cwd=tmp_path,
        argv=[],
        expected=expected,
        specs=specs,
        focus="add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)",
        max_time=540,
        timeout=120,
    )
    assert "@triton.jit" in result.code
    assert result.lines <= 30
    repro = tmp_path / "repro.py"
    repro.write_text(result.code)
    done = subprocess.run(
        [sys.executable, str(repro)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert "illegal memory access" in done.stderr, done.stderr[-2000:]
