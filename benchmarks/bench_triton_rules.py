"""Triton's own compiler against the compile rules, on the H200's Triton script reductions.

A candidate whose kernel cannot compile fails at its launch with a CompilationError instead of
the fault, and each such check still costs a process, a CUDA context and the compile. The rules
of reprocut.source.uncompilable and reprocut.source.triton_kinds reject such candidates unrun;
a rule that rejects one that compiles would cost the repro a smaller form. This replays the
bests of the H200's Triton script reductions (`replays/script-reductions-cuda.json.gz`) with
no GPU: every pass's candidates are made from each best; those the reducer admits are compiled
by Triton for the H200's target (sm_90; Triton compiles without a GPU), and so are those the
compile rules reject. The launch's argument kinds come from running the candidate up to its
launch with a stand-in torch whose tensors carry their shape and dtype only.

`admitted`: candidates the reducer would run; `cannot compile`: of them, those Triton refused
(checks a better rule would save); `rules reject`: candidates the compile rules reject for a
problem their best lacks; `but compile`: of them, those Triton compiled (must be 0).

    python benchmarks/bench_triton_rules.py [--tree PATH] [--out benchmarks/results/triton-rules-cpu.md]

Needs `triton` (3.6 on the GPU machine; `pip install triton` on a CPU machine is enough).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import gzip
import inspect
import json
import math
import os
import platform
import runpy
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPLAYS = ROOT / "benchmarks" / "replays" / "script-reductions-cuda.json.gz"
if "REPROCUT_BENCH_TREE" not in os.environ:  # a `--tree` run has that checkout first on its path
    sys.path.insert(0, str(ROOT))
TARGET = ("cuda", 90, 32)  # the H200's (and H100's): sm_90, warps of 32
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
           "float": "fp32", "float64": "fp64", "int64": "i64", "long": "i64", "int32": "i32",
           "int": "i32", "int8": "i8", "uint8": "u8", "bool": "i1"}  # fmt: skip


class _Tensor:
    """What a launch reads of a torch tensor: its dtype; its shape for `numel()` and sizes."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "fp32") -> None:
        self.shape, self.dtype = tuple(shape), dtype

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    def as_strided(self, shape: tuple[int, ...], *_: Any, **__: Any) -> _Tensor:
        return _Tensor(shape, self.dtype)

    def __getattr__(self, _: str) -> Any:  # .contiguous(), .detach(), .cuda(): the same tensor
        return lambda *a, **k: self


def _stand_in_torch() -> types.ModuleType:
    """A `torch` module whose factories make `_Tensor`s (no memory, no device)."""

    def make(*shape: Any, dtype: Any = None, **_: Any) -> _Tensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return _Tensor(shape, dtype if isinstance(dtype, str) else "fp32")

    torch = types.ModuleType("torch")
    for factory in ("randn", "rand", "empty", "zeros", "ones"):
        setattr(torch, factory, make)
    for like in ("empty_like", "zeros_like", "ones_like", "randn_like", "rand_like"):
        setattr(torch, like, lambda x, dtype=None, **_: _Tensor(x.shape, dtype or x.dtype))
    for name, short in _DTYPES.items():
        setattr(torch, name, short)
    torch.manual_seed = lambda *_: None  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(synchronize=lambda: None)  # type: ignore[attr-defined]
    return torch


class _Launched(Exception):
    """Raised in place of a kernel's launch: the kernel and its compile signature."""


def _stop_at_launch(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> None:
    bound = dict(zip((p.name for p in self.params), args, strict=False)) | kwargs
    signature, constants = {}, {}
    for param in self.params:
        value = bound.get(param.name, param.default)
        if value is inspect.Parameter.empty:  # Triton's binder raises before any compile
            raise _Launched(None, f"missing argument {param.name}", {})
        if param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", value
        elif isinstance(value, _Tensor):
            signature[param.name] = "*" + value.dtype
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i64" if abs(value) >= 2**31 else "i32"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{param.name}: {value!r} is no launch argument")
    raise _Launched(self, signature, constants)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Triton's MLIR passes print a refused kernel's IR (on fd 1 and 2) before raising."""
    sys.stdout.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            for fd, old in enumerate(saved, start=1):
                os.dup2(old, fd)
                os.close(old)


class Compiler:
    """Compiles a candidate script's launched kernel, answers cached by the script's text."""

    def __init__(self, folder: Path) -> None:
        # every candidate compiled from its source: a kernel found in Triton's cache is not
        # compiled again, and a missing import or a bad value would go unseen
        os.environ["TRITON_ALWAYS_COMPILE"] = "1"
        os.environ["TRITON_CACHE_DIR"] = str(folder / "triton-cache")
        import triton  # noqa: F401 (the benchmark's requirement, checked before anything runs)
        from triton.runtime.jit import JITFunction

        JITFunction.run = _stop_at_launch  # type: ignore[method-assign]
        sys.modules["torch"] = _stand_in_torch()
        self.folder = folder
        self.answers: dict[str, str | None] = {}

    def refusal(self, text: str) -> str | None:
        """Triton's refusal of the kernel the script launches (None: it compiled), or
        "not launched: ..." where the script did not reach a launch."""
        if text not in self.answers:
            self.answers[text] = self._compile(text)
        return self.answers[text]

    def _compile(self, text: str) -> str | None:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        path = self.folder / f"candidate_{len(self.answers)}.py"  # Triton reads its source file
        path.write_text(text)
        try:
            runpy.run_path(str(path), run_name="__main__")
        except _Launched as launched:
            kernel, signature, constants = launched.args
            if kernel is None:
                return f"TypeError: {signature}"
            source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
            try:
                with _quiet():
                    triton.compile(source, target=GPUTarget(*TARGET))
            except Exception as error:  # what Triton raises is the answer
                lines = str(error).strip().splitlines() or [""]
                return f"{type(error).__name__}: {lines[-1][:90]}"
            return None
        except Exception as error:  # a candidate may raise anything
            return f"not launched: {type(error).__name__}"
        return "not launched: no launch"


def _rule_refusals(text: str) -> collections.Counter[str]:
    """The compile rules' reasons for `text` (the rules this tree has)."""
    from reprocut.source.passes.tree import parse
    from reprocut.source.uncompilable import uncompilable_kernels

    module = parse(text)
    if module is None:
        return collections.Counter()
    found = collections.Counter(uncompilable_kernels(module))
    with contextlib.suppress(ImportError):  # a tree from before the kind rules
        from reprocut.source.triton_kinds import mistyped_kernels

        found.update(mistyped_kernels(module))
    return found


def replay(case: dict[str, Any], compiler: Compiler, sample: int | None = None) -> dict[str, Any]:
    """Admit and compile every pass's candidates from each best of one reduction (`sample`:
    from that many bests only, evenly spaced from the first to the last)."""
    from reprocut.model.case import Signature
    from reprocut.source.fixed_point import SourceReducer
    from reprocut.source.passes import PASSES, PassContext, candidates
    from reprocut.source.validity import Rules

    rules = Rules(memory_fault=case["memory_fault"], custom_op=case["custom_op"],
                  op_functions=tuple(case["op_functions"]), focus=case["focus"])  # fmt: skip
    expected = Signature("RuntimeError", None, None, "replayed")  # never compared: nothing runs
    admitted: collections.Counter[str] = collections.Counter()
    uncompilable: collections.Counter[str] = collections.Counter()
    refusals: collections.Counter[str] = collections.Counter()
    rejected, unjudged, unlaunched, false_rejections, seen = 0, 0, 0, [], set()
    for index, best in _sampled(case["bests"], sample):
        if compiler.refusal(best) is not None:
            raise RuntimeError(f"best {index} does not compile here: {compiler.refusal(best)}")
        context = PassContext(focus=case["focus"], memory_fault=case["memory_fault"])
        reducer = SourceReducer(best=best, expected=expected, check=lambda _: None, rules=rules,
                                context=context)  # fmt: skip
        theirs = _rule_refusals(best)
        for source_pass in PASSES:
            name = source_pass.__name__
            for text in candidates(source_pass, best, context):
                if text is None or text in seen:
                    continue
                seen.add(text)
                mine = _rule_refusals(text)
                if any(n > theirs.get(v, 0) for v, n in mine.items()):
                    rejected += 1
                    answer = compiler.refusal(text)
                    unjudged += bool(answer and answer.startswith("not launched"))
                    if answer is None:
                        false_rejections.append({"best": index, "pass": name, "rules": list(mine)})  # fmt: skip
                    continue
                if not reducer.admissible(text, name):
                    continue
                admitted[name] += 1
                answer = compiler.refusal(text)
                unlaunched += bool(answer and answer.startswith("not launched"))
                if answer is not None and not answer.startswith("not launched"):
                    uncompilable[name] += 1
                    refusals[answer] += 1
    return {
        "bests": len(case["bests"]),
        "admitted": sum(admitted.values()),
        "cannot_compile": sum(uncompilable.values()),
        "by_pass": {n: [admitted[n], uncompilable[n]] for n in admitted},
        "refusals": refusals.most_common(),
        "not_launched": unlaunched,
        "rules_reject": rejected,
        "rules_reject_unlaunched": unjudged,
        "but_compile": false_rejections,
    }


def _sampled(bests: list[str], sample: int | None) -> list[tuple[int, str]]:
    if sample is None or sample >= len(bests):
        return list(enumerate(bests))
    picked = sorted({round(i * (len(bests) - 1) / max(sample - 1, 1)) for i in range(sample)})
    return [(i, bests[i]) for i in picked]


def replay_all(sample: int | None = None) -> dict[str, dict[str, Any]]:
    data = json.loads(gzip.decompress(REPLAYS.read_bytes()))
    triton_cases = {n: c for n, c in sorted(data["cases"].items())
                    if any("@triton.jit" in best for best in c["bests"])}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="reprocut-triton-rules-") as folder:
        compiler = Compiler(Path(folder))
        return {name: replay(case, compiler, sample) for name, case in triton_cases.items()}


def report(here: dict[str, dict[str, Any]], there: dict[str, dict[str, Any]] | None,
           tree: Path | None, command: str) -> str:  # fmt: skip
    import triton

    from benchmarks.bench_reducer_work import commit_of

    data = json.loads(gzip.decompress(REPLAYS.read_bytes()))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Triton's compiler against the compile rules (cpu)",
        "",
        f"{now}, Python {platform.python_version()}, Triton {triton.__version__} compiling "
        f"for {TARGET[0]} sm_{TARGET[1]} with no GPU; commit {commit_of(ROOT)}. Command: "
        f"`{command}`.",
        "",
        f"The bests of the H200's Triton script reductions at {data['commit']} "
        "(`replays/script-reductions-cuda.json.gz`). `admitted`: the candidates made from them "
        "that the reducer would run; `cannot compile`: of those, the ones Triton refused (each "
        "a check spent on a CompilationError); `rules reject`: candidates the compile rules "
        "reject for a problem their best lacks; `raise first`: of those, the ones that raised "
        "before Triton compiled anything (a NameError at the kernel's `def` or in Triton's "
        "launch, a kernel called without its grid: what those rules say); `but compile`: of "
        "those rejected, the ones Triton compiled (a rule wrong about them; must be 0). Of the "
        "admitted, those that raised before a compile are not counted as refused. The reduction itself runs only some "
        "of the admitted candidates (it moves to a better best at the first that reproduces).",
        "",
    ]
    header = (
        "| case | bests | admitted | cannot compile | rules reject | raise first | but compile |"
    )
    if there is not None:
        header += " before: admitted | cannot compile | rules reject | but compile |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for name, row in here.items():
        cells = [name, row["bests"], row["admitted"], row["cannot_compile"], row["rules_reject"],
                 row["rules_reject_unlaunched"], len(row["but_compile"])]  # fmt: skip
        if there is not None and name in there:
            old = there[name]
            cells += [old["admitted"], old["cannot_compile"], old["rules_reject"],
                      len(old["but_compile"])]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if there is not None:
        lines += ["", f"Before: `{tree}` at commit {commit_of(tree) if tree else ''}."]
    for title, rows in (("This tree", here), ("Before", there or {})):
        for name, row in rows.items():
            if row["refusals"]:
                lines += ["", f"{title}, {name}: what Triton refused among the admitted:", ""]
                lines += [f"- {count} x `{why}`" for why, count in row["refusals"]]
    for name, row in (there or {}).items():
        wrong = collections.Counter(r for w in row["but_compile"] for r in w["rules"])
        if wrong:
            lines += ["", f"Before, {name}: the rules of the candidates Triton compiled:", ""]
            lines += [f"- {count} x `{rule}`" for rule, count in wrong.most_common()]
    for name, row in here.items():
        for wrong in row["but_compile"]:
            lines.append(f"- **{name}: best {wrong['best']}, {wrong['pass']}: rejected by "
                         f"{wrong['rules']} but compiled**")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/triton-rules-cpu.md")
    parser.add_argument("--json", action="store_true", help="print this tree's replay as JSON")
    parser.add_argument("--bests", type=int, default=None,
                        help="with --json: from this many bests of each case (a quick check)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench_triton_rules needs triton: pip install triton", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(replay_all(args.bests)))
        return 0
    from benchmarks.bench_reducer_work import replay_in  # the same `--tree` run

    there = replay_in(args.tree.resolve(), Path(__file__)) if args.tree else None
    here = replay_all()
    command = "python benchmarks/bench_triton_rules.py" + (f" --tree {args.tree}" if args.tree else "")  # fmt: skip
    text = report(here, there, args.tree, command)
    args.out.write_text(text)
    print(text)
    return 1 if any(row["but_compile"] for row in here.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
