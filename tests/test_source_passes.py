"""Each source pass alone, on small code, against an in-process predicate: exact results."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import libcst as cst
import pytest
import torch

from reprocut.model.case import Generated, Literal, Signature, TensorSpec
from reprocut.source.fixed_point import SourceReducer
from reprocut.source.integer_search import (
    first_integers,
    is_round,
    round_below,
    round_down,
    smaller_integers,
)
from reprocut.source.passes import (
    PassContext,
    SourcePass,
    calls_focus,
    candidates,
    delete_statements,
    drop_arguments,
    fold_tensor_facts,
    hoist_subexpressions,
    inline_calls,
    inline_names,
    inline_sibling_imports,
    is_constant,
    jump_to_call,
    remove_all_unused,
    remove_unused_definitions,
    replace_with_specs,
    shrink_integers,
    simplify_expressions,
    spec_expression,
    strip_comments,
    unwrap_blocks,
)
from reprocut.source.passes.expressions import names_reaching
from reprocut.source.passes.focus_calls import focus_calls
from reprocut.source.passes.specs import seeded, without_dead_binding
from reprocut.source.size import sort_key

VALUE_ERROR = Signature("ValueError", None, None, "bad")


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def raises_bad(source: str) -> Signature | None:
    """Run the code in this process: a ValueError('bad') is the bug under reduction."""
    try:
        exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
    except ValueError as exc:
        return Signature("ValueError", None, None, str(exc))
    except Exception as exc:
        return Signature(type(exc).__name__, None, None, str(exc))
    return None


def reduce_with(
    passes: Sequence[SourcePass],
    source: str,
    check: Callable[[str], Signature | None] = raises_bad,
    context: PassContext | None = None,
) -> str:
    reducer = SourceReducer(
        best=source,
        expected=VALUE_ERROR,
        check=check,
        context=context or PassContext(),
        passes=passes,
    )
    assert reducer.run() == "fixed point"
    return reducer.best


def render(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def test_delete_statements_keeps_only_what_the_failure_needs():
    source = code("""
        a = 1
        b = "bad"
        c = [a] * 3
        print(c)
        raise ValueError(b)
        print("never")
    """)
    assert reduce_with([delete_statements], source) == code("""
        b = "bad"
        raise ValueError(b)
    """)


def test_delete_statements_leaves_pass_in_an_emptied_block():
    source = code("""
        if True:
            x = 1
        raise ValueError("bad")
    """)
    # the whole `if` goes first; an emptied block is written as `pass` when only its body goes
    found = list(candidates(delete_statements, source, PassContext()))
    assert (
        code("""
        if True:
            pass
        raise ValueError("bad")
    """)
        in found
    )
    assert reduce_with([delete_statements], source) == 'raise ValueError("bad")\n'


def test_unwrap_blocks_unrolls_a_loop_to_its_first_iteration():
    source = code("""
        for i, word in enumerate(["bad", "good"]):
            raise ValueError(word)
    """)
    assert reduce_with([unwrap_blocks], source) == code("""
        i, word = next(iter(enumerate(["bad", "good"])))
        raise ValueError(word)
    """)


def test_unwrap_blocks_keeps_loops_that_break():
    source = code("""
        for word in ["good", "bad"]:
            if word == "good":
                continue
            raise ValueError(word)
    """)
    unrolled = [c for c in candidates(unwrap_blocks, source, PassContext()) if "next(" in c]
    assert unrolled == []


def test_unwrap_blocks_takes_the_branch_that_fails():
    source = code("""
        n = 1
        if n > 10:
            x = "good"
        elif n > 5:
            x = "fine"
        else:
            x = "bad"
        with open(__file__ if False else "/dev/null") as handle:
            raise ValueError(x)
    """)
    assert reduce_with([unwrap_blocks], source) == code("""
        n = 1
        x = "bad"
        handle = open(__file__ if False else "/dev/null")
        raise ValueError(x)
    """)


def test_unwrap_blocks_flattens_the_main_guard_and_try():
    source = code("""
        if __name__ == "__main__":
            try:
                raise ValueError("bad")
            except KeyError:
                pass
    """)
    assert reduce_with([unwrap_blocks], source) == 'raise ValueError("bad")\n'


def test_inline_sibling_imports_pastes_the_module(tmp_path: Path):
    (tmp_path / "helpers.py").write_text(
        code("""
            from __future__ import annotations
            LIMIT = 3

            def check(n):
                if n > LIMIT:
                    raise ValueError("bad")

            if __name__ == "__main__":
                check(0)
        """)
    )
    context = PassContext(search_dirs=(tmp_path,))
    source = "from helpers import check as verify\nverify(5)\n"
    [candidate] = candidates(inline_sibling_imports, source, context)
    assert candidate == code("""
        LIMIT = 3

        def check(n):
            if n > LIMIT:
                raise ValueError("bad")
        verify = check
        verify(5)
    """)
    qualified = "import helpers as h\nh.check(h.LIMIT + 1)\n"
    [candidate] = candidates(inline_sibling_imports, qualified, context)
    assert candidate.endswith("check(LIMIT + 1)\n")
    assert "import" not in candidate


def test_inline_sibling_imports_leaves_the_docstring_and_imports_already_made(tmp_path: Path):
    (tmp_path / "kernels.py").write_text(
        code('''
            """A kernel module."""
            import math
            import torch

            def scale(x):
                return torch.full((1,), math.pi) * x
        ''')
    )
    context = PassContext(search_dirs=(tmp_path,))
    source = "import torch\nfrom kernels import scale\nscale(torch.ones(2))\n"
    [candidate] = candidates(inline_sibling_imports, source, context)
    assert candidate == code("""
        import torch
        import math

        def scale(x):
            return torch.full((1,), math.pi) * x
        scale(torch.ones(2))
    """)


def test_inline_sibling_imports_leaves_installed_modules_alone(tmp_path: Path):
    context = PassContext(search_dirs=(tmp_path,))
    assert list(candidates(inline_sibling_imports, "import json\n", context)) == []


def test_inline_calls_binds_parameters_and_drops_the_function():
    source = code("""
        def f(a, b=2):
            c = a * b
            return c + 1
        x = f(i, b=3)
    """)
    assert list(candidates(inline_calls, source, PassContext())) == [
        code("""
            b = 3
            c = i * b
            x = c + 1
        """)
    ]


def test_inline_calls_inlines_a_module_forward_through_its_instance():
    source = code("""
        class Model:
            def forward(self, x):
                h = self.scale(x)
                return h * 2
        model = Model()
        y = model(batch)
    """)
    assert next(candidates(inline_calls, source, PassContext())) == code("""
        class Model:
            pass
        model = Model()
        h = model.scale(batch)
        y = h * 2
    """)


def test_inline_calls_skips_functions_with_early_returns():
    source = code("""
        def f(a):
            if a:
                return 1
            return 2
        x = f(0)
    """)
    assert list(candidates(inline_calls, source, PassContext())) == []


def test_shrink_integers_finds_the_smallest_failing_constant():
    source = code("""
        epochs = 100
        batch = 64
        if batch > 5:
            raise ValueError("bad")
    """)
    assert reduce_with([shrink_integers], source) == code("""
        epochs = 0
        batch = 1
        if batch > 0:
            raise ValueError("bad")
    """)


def test_shrink_integers_searches_round_values_to_a_threshold_in_few_rounds():
    """A size that must stay above 600 ends at the smallest round value above it (640: three
    significant binary digits), found in a few rounds of values checked side by side, not by a
    walk of one less at a time (400 checks here, minutes on a GPU) nor a bisection to 601."""
    source = code("""
        n = 1000
        if n > int("600"):
            raise ValueError("bad")
    """)
    runs = []

    def counted(candidate: str) -> Signature | None:
        runs.append(candidate)
        return raises_bad(candidate)

    for ways in (2, 4):
        runs.clear()
        reduced = reduce_with([shrink_integers], source, counted, context=PassContext(ways=ways))
        assert reduced.startswith("n = 640\n") and len(runs) <= 14
    # a round: 0 and 1 while not known, the span's cuts and the round value below, all round
    assert smaller_integers(1024) == [0, 1, 32, 896]
    assert smaller_integers(600, low=512) == []  # no round value between: 600 stays
    assert smaller_integers(3, low=2) == [] and smaller_integers(1) == [0]
    assert smaller_integers(1024, ways=4) == [0, 1, 5, 32, 160, 896]
    assert smaller_integers(1000, low=512, ways=4) == [640, 768, 896]


def test_a_size_far_above_its_threshold_is_found_in_a_few_rounds():
    """The H200's expand_bias: `n = 268435456` whose fault needs n > 5242880 took 17 rounds of
    accepted values one after another (27 s); cut on a log scale, it takes at most five, and
    ends at a round value: 6291456 (1.5 * 2**22)."""
    source = code("""
        n = 268435456
        if n > int("5242880"):
            raise ValueError("bad")
    """)
    for ways in (2, 4):
        reducer = SourceReducer(
            best=source, expected=VALUE_ERROR, check=raises_bad,
            context=PassContext(ways=ways), passes=[shrink_integers],
        )  # fmt: skip
        assert reducer.run() == "fixed point"
        assert reducer.best.startswith("n = 6291456\n")
        assert sum(reducer.accepted.values()) <= (6 if ways == 2 else 4)
        assert reducer.checks <= 14


def test_round_values_have_three_significant_binary_digits():
    assert [v for v in range(60, 130) if is_round(v)] == [64, 80, 96, 112, 128]
    assert all(is_round(v) for v in range(8)) and not is_round(-1)
    assert round_down(5242881) == 5242880 and round_down(601) == 512 and round_down(7) == 7
    assert round_below(4096) == 3584 and round_below(5) == 4 and round_below(0) == -1


def test_a_stuck_integer_costs_one_round_not_a_bisection_up_to_it():
    """A size that must stay as it is (here: exactly 4096) is given up once 0, half and the
    round value below it are rejected: three runs, where the search up to 4095 took a dozen."""
    source = code("""
        n = 4096
        if n == 4096:
            raise ValueError("bad")
    """)
    runs = []

    def counted(candidate: str) -> Signature | None:
        runs.append(candidate)
        return raises_bad(candidate)

    assert reduce_with([shrink_integers], source, counted) == source
    assert len(runs) == 2 * 3  # two integers of 4096: 0, half and the round value below each
    runs.clear()
    assert reduce_with([shrink_integers], source, counted, context=PassContext(ways=4)) == source
    assert len(runs) == 2 * 3
    assert first_integers(4096) == [0, 2048, 3584]
    assert first_integers(4096, low=0) == [1, 2048, 3584]
    assert first_integers(601) == [0, 256, 512]
    assert first_integers(3) == [0, 1, 2] and first_integers(5, low=4) == []


def test_an_integer_halves_and_then_searches_the_span_below_the_value_it_took():
    """Once a first smaller value is accepted, the span below it is searched (not halved round
    by round): the same round threshold for one slot or four."""
    source = code("""
        n = 4096
        if n > int("600"):
            raise ValueError("bad")
    """)
    for ways in (2, 4):
        assert reduce_with([shrink_integers], source, context=PassContext(ways=ways)).startswith(
            "n = 640\n"
        )


def test_shrink_integers_keeps_a_launchs_grid_and_block_at_one_or_more():
    """A shrunk CuPy launch read `ROWSUM((rows,), (0,), ...)`: 0 threads a block is an invalid
    launch configuration, which the stand-in kernel below does not check (the fork's blocking
    launches did not either). The integers a grid or block is made of stop at 1."""
    source = code("""
        def ROWSUM(grid, block, args):
            raise ValueError("bad")

        rows = 512
        threads = 256
        cols = 65
        ROWSUM((rows // 128,), (threads,), (rows, cols))
    """)
    assert reduce_with([shrink_integers], source) == code("""
        def ROWSUM(grid, block, args):
            raise ValueError("bad")

        rows = 1
        threads = 1
        cols = 0
        ROWSUM((rows // 1,), (threads,), (rows, cols))
    """)
    triton = code("""
        class Kernel:
            def __getitem__(self, grid):
                raise ValueError("bad")

        kernel = Kernel()
        kernel[(8, 2)](3)
    """)
    assert reduce_with([shrink_integers], triton).endswith("kernel[(1, 1)](0)\n")


def test_drop_arguments_lets_defaults_apply():
    source = code("""
        def f(a, b=1, *, mode="bad"):
            raise ValueError(mode)
        f(1, 2, mode="bad")
    """)
    assert reduce_with([drop_arguments], source) == code("""
        def f(a, b=1, *, mode="bad"):
            raise ValueError(mode)
        f(1)
    """)


def test_remove_unused_definitions():
    source = code("""
        import os
        import json as j, sys
        from math import pi, tau
        def unused():
            return unused()
        class Used:
            pass
        data = 3
        raise ValueError(Used.__name__ and "bad" if sys else tau)
    """)
    assert reduce_with([remove_unused_definitions], source) == code("""
        import json as j, sys
        from math import pi, tau
        class Used:
            pass
        raise ValueError(Used.__name__ and "bad" if sys else tau)
    """)


def test_remove_all_unused_is_one_candidate_or_none():
    source = code("""
        import os
        B, T, D = 256, 256, 4096
        x = 1
        raise ValueError(x)
    """)
    assert list(candidates(remove_all_unused, source, PassContext())) == [
        "x = 1\nraise ValueError(x)\n"
    ]
    assert list(candidates(remove_all_unused, "x = 1\nraise ValueError(x)\n", PassContext())) == []


def test_the_forward_torch_runs_is_not_unused():
    """`Fn.apply(x)` and `module(x)` run `forward` without naming it; other methods nothing
    names go, as `backward` does when no gradient is asked for."""
    source = code("""
        import torch
        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                raise ValueError("bad")
            @staticmethod
            def backward(ctx, grad):
                return grad
        class Plain:
            def run(self, x):
                return x
        Scale.apply(torch.ones(2))
        Plain()
    """)
    (candidate,) = candidates(remove_all_unused, source, PassContext())
    assert "def forward(ctx, x)" in candidate and "def backward" not in candidate
    assert "def run" not in candidate  # a plain class's method nothing names
    assert raises_bad(candidate) == VALUE_ERROR


def test_inline_names_splits_tuple_assignments_and_inlines_literals():
    source = code("""
        import types
        stats = types.SimpleNamespace(mean=2.0, std=3.0)
        mean, std = stats.mean, stats.std
        width = 4
        SOURCE = '''
        kernel
        '''
        a, b = 1, 2
        a, b = b, a
        count = 0
        threads = 0
        def launch(n, *, threads=1):
            return n + threads
        if launch(width, threads=count) + mean + threads == 6.0 and (a, b) == (2, 1) and SOURCE:
            raise ValueError("bad")
    """)
    assert reduce_with([inline_names, remove_unused_definitions], source) == code("""
        import types
        stats = types.SimpleNamespace(mean=2.0, std=3.0)
        mean = stats.mean
        SOURCE = '''
        kernel
        '''
        a, b = 1, 2
        a, b = b, a
        threads = 0
        def launch(n, *, threads=1):
            return n + threads
        if launch(4, threads=0) + mean + threads == 6.0 and (a, b) == (2, 1) and SOURCE:
            raise ValueError("bad")
    """)


def test_strip_comments():
    source = "# header\nx = 1  # why\n\n# lead\nraise ValueError('bad')\n"
    assert list(candidates(strip_comments, source, PassContext())) == [
        "x = 1\n\nraise ValueError('bad')\n"
    ]


def test_strip_comments_drops_docstrings_but_keeps_a_body():
    source = textwrap.dedent('''\
        """What the script was for."""

        def f():
            """Doc."""
            return 1

        def g():
            """The whole body."""

        raise ValueError(f())
    ''')
    assert list(candidates(strip_comments, source, PassContext())) == [
        textwrap.dedent('''\
            def f():
                return 1

            def g():
                """The whole body."""

            raise ValueError(f())
        ''')
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (TensorSpec((4, 8)), "torch.randn((4, 8))"),
        (
            TensorSpec((4, 8), (0, 1), dtype="float16", device="cuda"),
            "torch.randn((8,), dtype=torch.float16, device='cuda').as_strided((4, 8), (0, 1))",
        ),
        (
            TensorSpec((3,), storage_offset=1, dtype="int64"),
            "torch.zeros((4,), dtype=torch.int64).as_strided((3,), (1,), 1)",
        ),
        (
            TensorSpec((2, 2), dtype="int64", values=Generated("randint", 0, 7)),
            "torch.randint(0, 7, (2, 2))",
        ),
        (
            TensorSpec((2, 2), dtype="int32", values=Generated("randint", 0, 7)),
            "torch.randint(0, 7, (2, 2), dtype=torch.int32)",
        ),
        (
            TensorSpec((2,), dtype="int64", values=Literal((1, 2))),
            "torch.tensor((1, 2)).reshape((2,))",
        ),
        (
            TensorSpec((2,), values=Literal((1, 2))),
            "torch.tensor((1, 2), dtype=torch.float32).reshape((2,))",
        ),
        (TensorSpec((2,), values=Literal((0.5, 2))), "torch.tensor((0.5, 2)).reshape((2,))"),
    ],
)
def test_spec_expression_text(spec: TensorSpec, expected: str):
    assert render(spec_expression(spec)) == expected
    if spec.device == "cpu":
        assert eval(expected, {"torch": torch}).dtype == getattr(torch, spec.dtype)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (TensorSpec((4, 8)), "torch.randn((4, 8), dtype=torch.float32)"),
        (
            TensorSpec((2,), values=Literal((0.5, 2))),
            "torch.tensor((0.5, 2), dtype=torch.float32).reshape((2,))",
        ),
        (
            TensorSpec((2,), dtype="int64", values=Literal((1, 2))),
            "torch.tensor((1, 2)).reshape((2,))",
        ),
    ],
)
def test_spec_expression_names_float32_where_the_script_changes_the_default(
    spec: TensorSpec, expected: str
):
    script = "import torch\ntorch.set_default_dtype(torch.float64)\n"
    assert render(spec_expression(spec, script)) == expected
    made = eval(render(spec_expression(spec, script)), {"torch": torch})
    torch.set_default_dtype(torch.float64)
    try:
        assert eval(expected, {"torch": torch}).dtype == made.dtype == getattr(torch, spec.dtype)
    finally:
        torch.set_default_dtype(torch.float32)


def test_spec_expression_keeps_strides_and_offset():
    spec = TensorSpec((3, 5), (1, 3), storage_offset=2, dtype="float64")
    tensor = eval(render(spec_expression(spec)), {"torch": torch})
    assert tuple(tensor.shape) == (3, 5)
    assert tensor.stride() == (1, 3)
    assert tensor.storage_offset() == 2
    assert tensor.dtype == torch.float64
    expanded = TensorSpec((4, 6), (0, 1))
    tensor = eval(render(spec_expression(expanded)), {"torch": torch})
    assert tensor.stride() == (0, 1)
    assert tensor.untyped_storage().nbytes() == 6 * 4


def test_replace_with_specs_targets_the_focus_call():
    spec = TensorSpec((2, 3), (0, 1))
    context = PassContext(specs=(spec,), focus="launch(bias, out)")
    source = code("""
        h = model(x)
        launch(h.bias, out)
    """)
    found = list(candidates(replace_with_specs, source, context))
    assert found[0] == code("""
        torch.manual_seed(0)
        h = model(x)
        launch(torch.randn((3,)).as_strided((2, 3), (0, 1)), out)
    """)  # a random tensor's candidate is seeded: every run draws the same values
    assert all("model(torch" not in c for c in found)


def test_a_tensor_built_from_literals_is_an_atom_for_the_size_order():
    assert is_constant(cst.parse_expression("torch.randn((3,)).as_strided((2, 3), (0, 1))"))
    assert not is_constant(cst.parse_expression("torch.randn(n)"))
    before = "launch(h.bias)\n"
    after = "launch(torch.randn((3,)).as_strided((2, 3), (0, 1)))\n"
    assert sort_key(after) < sort_key(before)


def test_replace_with_specs_replaces_a_name_wherever_its_function_reads_it():
    spec = TensorSpec((2, 3), (0, 1))
    context = PassContext(specs=(TensorSpec((2, 3)), spec), focus="kernel[grid](x, cond)")
    source = code("""
        def forward(x, cond):
            n = cond.numel()
            kernel[grid](x, cond)
            cond = None
            return n
    """)
    found = list(candidates(replace_with_specs, source, context))
    built = "torch.randn((3,)).as_strided((2, 3), (0, 1))"
    assert len(found) == 2  # each argument tries the spec recorded at its position
    assert found[1] == code(f"""
        torch.manual_seed(0)
        def forward(x, cond):
            n = {built}.numel()
            kernel[grid](x, {built})
            cond = None
            return n
    """)


def test_inline_calls_runs_an_autograd_function_forward_in_place():
    source = code("""
        class AddCond(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, cond):
                out = launch(x, cond)
                return out

        y = AddCond.apply(h, c)
    """)
    assert next(candidates(inline_calls, source, PassContext())) == code("""
        class AddCond(torch.autograd.Function):
            pass
        out = launch(h, c)
        y = out
    """)


def test_simplify_expressions_and_hoist_subexpressions():
    source = code("""
        def model(x):
            raise ValueError("bad")
        data = load("train.csv")
        total = (model(data).argmax() == 3).sum()
    """)
    assert reduce_with([simplify_expressions, hoist_subexpressions], source) == code("""
        def model(x):
            raise ValueError("bad")
        data = 0
        model(0)
    """)


def test_hoisting_offers_no_module_for_a_value():
    """`np.int32(n)` -> `np`, `torch.randn(...)` -> `torch`: no call takes a module for a value
    (on the CPU stand-in of the misaligned case, `os.path.join(...)` -> `os.path` was one such
    check)."""
    source = code("""
        import sys
        import numpy as np
        import torch as T
        x = T.randn(4).mul(np.int32(2))
        y = T.ones_like(x)
        sys.path.insert(0, "vendor")
    """)
    found = list(candidates(hoist_subexpressions, source, PassContext()))
    assert found and not any(text in c for c in found for text in ("y = T\n", ".mul(np)"))
    assert any("y = x\n" in c for c in found)
    assert any("x = T.randn(4)\n" in c for c in found)  # `.mul(...)` -> its receiver
    assert any("x = np.int32(2)\n" in c for c in found)  # -> its argument
    # a statement's call cut to its receiver does nothing, as deleting it does: not offered
    assert not any("\nsys.path\n" in c for c in found)


def test_hoisting_offers_no_tensor_for_its_int_nor_a_shape_for_its_item():
    """`ids.numel()` -> `ids` and `table.shape[1]` -> `table.shape`: an int's place taken by a
    tensor or a shape. In the faults calls' logs all 49 such checks failed otherwise."""
    source = code("""
        import torch
        ids = torch.arange(6)
        table = torch.ones(8, 4)
        out = torch.empty(ids.numel(), table.shape[1], table.size(0), table.size())
        rows = table.stride(0) + ids.dim()
    """)
    found = list(candidates(hoist_subexpressions, source, PassContext()))
    changed = {line for c in found for line in c.splitlines()} - set(source.splitlines())
    for never in (
        "out = torch.empty(ids, table.shape[1], table.size(0), table.size())",
        "out = torch.empty(ids.numel(), table.shape, table.size(0), table.size())",
        "out = torch.empty(ids.numel(), table.shape[1], table, table.size())",
        "rows = table + ids.dim()",
        "rows = table.stride(0) + ids",
    ):
        assert never not in changed, never
    assert "out = torch.empty(ids.numel(), table.shape[1], table.size(0), table)" in changed
    assert "out = ids.numel()" in changed  # a call for its first argument: still offered
    assert "rows = table.stride(0)" in changed  # arithmetic for an operand: still offered


def test_facts_of_literal_tensors_fold_to_literals():
    """On the H200 a CuPy reduction kept `n = torch.randn((256, 256, 4096)).numel()`: a 1 GiB
    tensor drawn on the CPU by every later check, for one integer."""
    source = code("""
        import torch
        n = torch.randn((256, 256, 4096)).numel()
        rows = torch.zeros(64, 8, device="cuda").shape[0]
        dims = torch.randn((1024,)).as_strided((4, 256), (256, 1)).dim()
        width = torch.randint(0, 5, (3, 7)).size(-1)
        if n != 268435456 or rows != 64 or dims != 2 or width != 7:
            raise ValueError("bad")
        raise ValueError("bad")
    """)
    changed = list(candidates(fold_tensor_facts, source, PassContext()))
    assert changed[0] == source.replace(
        "torch.randn((256, 256, 4096)).numel()", "268435456"
    ).replace('torch.zeros(64, 8, device="cuda").shape[0]', "64").replace(
        "torch.randn((1024,)).as_strided((4, 256), (256, 1)).dim()", "2"
    ).replace("torch.randint(0, 5, (3, 7)).size(-1)", "7")  # all at once, then one by one
    assert len(changed) == 5
    for folded_code in changed:  # each fold counts as smaller in the size order
        assert sort_key(folded_code) < sort_key(source)
    # shapes not written as literals stay
    kept = code("""
        import torch
        x = torch.randn(8)
        n = x.numel()
        m = torch.randn(8).view(-1, 2).size(0)
        raise ValueError("bad")
    """)
    assert list(candidates(fold_tensor_facts, kept, PassContext())) == []
    # a whole shape, as a tuple: `n_bags, bag = torch.randint(...).shape` (an H200 CuPy repro)
    shapes = code("""
        import torch
        n_bags, bag = torch.randint(53, 1098525229974, (256, 7)).shape
        m = torch.zeros(3, 4).size()
        raise ValueError("bad")
    """)
    folds = list(candidates(fold_tensor_facts, shapes, PassContext()))
    assert folds[0] == code("""
        import torch
        n_bags, bag = (256, 7)
        m = (3, 4)
        raise ValueError("bad")
    """)
    assert len(folds) == 3 and all(sort_key(f) < sort_key(shapes) for f in folds)


MEMORY_FAULT_LAUNCH = code("""
    import cupy
    import torch
    x = torch.randn((4, 8), device="cuda")
    out = torch.empty_like(x)
    pe = torch.randn((8,), device="cuda").expand(4, 8)
    args = (cupy.asarray(x.detach()), cupy.asarray(pe), cupy.asarray(out))
    mean = x.mean().item()
    _KERNEL((1,), (32,), args)
""")


def test_a_memory_fault_keeps_what_reaches_the_failing_call():
    """On the H200, `out = torch.empty_like(x)` became `out = 0`: the kernel still faulted, on
    a write past a one-element buffer instead of the read past the stride-0 `pe`."""
    focus = "_KERNEL((blocks,), (threads,), args)"
    memory = PassContext(focus=focus, memory_fault=True)
    changed = list(candidates(simplify_expressions, MEMORY_FAULT_LAUNCH, memory))
    assert changed == [
        MEMORY_FAULT_LAUNCH.replace("x.mean().item()", value) for value in ("0", "None")
    ]
    # another failure (a device assert, a Python error) may have them swapped out
    other = list(candidates(simplify_expressions, MEMORY_FAULT_LAUNCH, PassContext(focus=focus)))
    assert MEMORY_FAULT_LAUNCH.replace("torch.empty_like(x)", "0") in other
    # nor the kernel it launches, nor the grid of a Triton launch: on the H200's fixed points
    # `cupy.RawKernel(None, ...)` and `grid = None` were checks that could only raise
    built = MEMORY_FAULT_LAUNCH.replace(
        "import torch\n", 'import torch\n_KERNEL = cupy.RawKernel(SRC, "k")\n'
    )
    assert not any("RawKernel(0" in c or "RawKernel(None" in c
                   for c in candidates(simplify_expressions, built, memory))  # fmt: skip
    triton = "import torch\nn = 64\ngrid = (n // 4,)\nkernel[grid](torch.randn(n), n)\n"
    launched = PassContext(focus="kernel[grid](torch.randn(n), n)", memory_fault=True)
    assert list(candidates(simplify_expressions, triton, launched)) == []


def test_names_reaching_the_failing_call_follow_assignments():
    module = cst.parse_module(MEMORY_FAULT_LAUNCH)
    calls = focus_calls(module, "_KERNEL((b,), (t,), args)")
    # the launch's arguments, what computes them, and what it calls (the kernel itself)
    assert names_reaching(module, calls) == {"args", "cupy", "x", "pe", "out", "torch", "_KERNEL"}
    assert focus_calls(module, None) == [] and names_reaching(module, []) == set()


def test_calls_focus_names_the_failing_call():
    focus = "add_kernel[grid](x, y, out, n, BLOCK=1024)  # reprocut: culprit"
    assert calls_focus("add_kernel[grid](a, b)\n", focus) is True
    assert calls_focus("add_kernel[other](a, b)\n", focus) is False
    assert calls_focus("x = 1\n", None) is None


def test_replace_with_specs_replaces_tensor_parameters_of_the_launching_function():
    spec = TensorSpec((4,), storage_offset=3)
    context = PassContext(named_specs=(("x", spec),), focus="launch((blocks,), args)")
    source = code("""
        def cmvn(x):
            args = (asarray(x), x.numel())
            launch((blocks,), args)
        cmvn(feats[3:7])
    """)
    built = "torch.randn((7,)).as_strided((4,), (1,), 3)"
    assert next(candidates(replace_with_specs, source, context)) == code(f"""
        torch.manual_seed(0)
        def cmvn(x):
            args = (asarray({built}), {built}.numel())
            launch((blocks,), args)
        cmvn(feats[3:7])
    """)


def test_replace_with_specs_moves_a_name_the_jump_bound_to_its_spec_into_the_call():
    """After jump_to_call, `x = <its spec>` is there: its spec in the call is a candidate only
    with that binding gone in the same candidate (one line shorter for one check); another
    tensor for reads that keep `x` (on the H200: a second 1 GB `randn` in every candidate) is
    none. A name bound to something else is replaced as before."""
    spec = TensorSpec((4,), storage_offset=3)
    built = "torch.randn((7,)).as_strided((4,), (1,), 3)"
    context = PassContext(specs=(spec,), named_specs=(("x", spec),), focus="launch(x)")
    jumped = f"x = {built}\nlaunch(x)\n"
    moved = list(candidates(replace_with_specs, jumped, context))
    assert moved and all(f"launch({built})" in c and "x =" not in c for c in moved)
    still_read = f"x = {built}\nlaunch(x)\ndef total():\n    return x.sum()\n"
    assert all("x =" not in c for c in candidates(replace_with_specs, still_read, context))
    computed = "x = feats[3:7]\nlaunch(x)\n"
    assert f"launch({built})" in next(candidates(replace_with_specs, computed, context))


def test_without_dead_binding_drops_only_what_nothing_reads():
    assert without_dead_binding("x = 1\ny = 2\nf(y)\n", "x") == "y = 2\nf(y)\n"
    assert without_dead_binding("x = 1\nf(x)\n", "x") is None
    assert without_dead_binding("x = 1\ndef g():\n    return x\n", "x") is None  # read inside
    assert without_dead_binding("x = 1\nfor x in y:\n    pass\n", "x") is None  # bound twice
    assert without_dead_binding("def f(x):\n    return x\nx = 1\n", "x") == (
        "def f(x):\n    return x\n"
    )  # a parameter of the same name is another variable


# --- jump_to_call ----------------------------------------------------------------------------

TRAINING = code("""
    import sys

    import torch

    sys.path.insert(0, "vendor")
    SCALE = 4


    class Model:
        def forward(self, x):
            return x * SCALE


    def kernel(x, scale=SCALE):
        if x.storage_offset() % 4:
            raise ValueError("bad")
        return x * scale


    def normalize(x, eps=1e-5, *, scale=SCALE):
        mean = x.mean()
        out = kernel(x, scale) - mean + eps
        return out


    def main():
        model = Model()
        for step in range(10):
            batch = torch.randn(64)
            normalize(model.forward(batch[step:]))


    if __name__ == "__main__":
        main()
""")
OFFSET_VIEW = TensorSpec((60,), storage_offset=3)


def test_jump_to_call_binds_the_probed_tensors_and_keeps_the_set_up():
    context = PassContext(
        named_specs=(("x", OFFSET_VIEW),), focus="out = kernel(x, scale) - mean + eps"
    )
    pruned, pruned_eager, whole, whole_eager = candidates(jump_to_call, TRAINING, context)
    set_up = code("""
        import sys

        import torch
        torch.manual_seed(0)

        sys.path.insert(0, "vendor")
        SCALE = 4


        def kernel(x, scale=SCALE):
            if x.storage_offset() % 4:
                raise ValueError("bad")
            return x * scale
        x = torch.randn((63,)).as_strided((60,), (1,), 3)
    """)
    assert pruned_eager == set_up + code("""
        eps = 1e-5
        scale = SCALE
        mean = x.mean()
        out = kernel(x, scale) - mean + eps
    """)
    assert pruned == set_up + code("""
        mean = x.mean()
        eps = 1e-5
        scale = SCALE
        out = kernel(x, scale) - mean + eps
    """)  # each parameter made just before its first use: the failing call's tensors come last
    assert "class Model" in whole and "def main" in whole and "\n    main()" not in whole
    assert whole_eager.rindex("eps = 1e-5") < whole_eager.rindex("mean = x.mean()")
    assert raises_bad(pruned) == raises_bad(pruned_eager) == VALUE_ERROR


def test_jump_to_call_needs_probed_tensors_and_a_call_inside_a_function():
    focus = "out = kernel(x, scale) - mean + eps"
    assert list(candidates(jump_to_call, TRAINING, PassContext(focus=focus))) == []
    at_top = PassContext(named_specs=(("x", OFFSET_VIEW),), focus="main()")
    assert list(candidates(jump_to_call, TRAINING, at_top)) == []


MODEL_KERNEL = code("""
    import torch

    RANK = 8


    def kernel(x, bias, scale=1.0):
        if bias.stride(0) == 0:
            raise ValueError("bad")
        return x + bias * scale


    class Model:
        def __init__(self):
            self.bias = torch.zeros(RANK)

        def forward(self, x, scale):
            hidden = x * 2
            return kernel(hidden, self.bias.expand_as(hidden), scale=0.5)


    def main():
        model = Model()
        for step in range(3):
            model.forward(torch.randn(4, RANK), step)


    main()
""")
EXPANDED = TensorSpec((4, 8), stride=(0, 1))


def test_jump_to_call_makes_the_failing_call_alone_where_its_function_takes_self():
    """`forward(self, x)`: no probe makes `self`, so the body's candidates fail; the last one
    is the definitions the call needs and the call itself, on the probed tensors."""
    focus = "return kernel(hidden, self.bias.expand_as(hidden), scale=0.5)"
    context = PassContext(
        specs=(TensorSpec((4, 8)), EXPANDED), named_specs=(("x", TensorSpec((4, 8))),), focus=focus
    )
    *with_body, alone = candidates(jump_to_call, MODEL_KERNEL, context)
    assert all("self.bias" in c for c in with_body)  # each reads a `self` nothing binds
    assert alone.endswith(
        "kernel(torch.randn((4, 8)), torch.randn((8,)).as_strided((4, 8), (0, 1)), scale=0.5)\n"
    )
    assert "def kernel" in alone and "torch.manual_seed(0)" in alone
    assert "class Model" not in alone and "def main" not in alone and "RANK" not in alone
    assert raises_bad(alone) == VALUE_ERROR
    # only the call's own tensors known: the call alone is the one candidate
    only_args = PassContext(specs=context.specs, focus=focus)
    assert list(candidates(jump_to_call, MODEL_KERNEL, only_args)) == [alone]


def test_the_call_alone_needs_every_argument_probed_or_constant():
    """`scale=scale`, a parameter's value, is neither a probed tensor nor a constant."""
    focus = "return kernel(hidden, self.bias.expand_as(hidden), scale=scale)"
    source = MODEL_KERNEL.replace("scale=0.5)", "scale=scale)")
    context = PassContext(specs=(TensorSpec((4, 8)), EXPANDED), focus=focus)
    assert list(candidates(jump_to_call, source, context)) == []
    one_short = PassContext(
        specs=(TensorSpec((4, 8)),), focus=focus.replace("scale=scale", "scale=0.5")
    )
    assert list(candidates(jump_to_call, MODEL_KERNEL, one_short)) == []


LAUNCHING_LAYER = code("""
    import torch


    class Kernel:
        \"\"\"`kernel[grid](...)` as Triton launches, raising where a real kernel would fault.\"\"\"

        def __getitem__(self, grid):
            def launch(x, out, n, scale, BLOCK):
                if grid[0] * BLOCK > x.numel():
                    raise ValueError("bad")

            return launch


    kernel = Kernel()


    class Layer:
        temperature = 2.0

        def forward(self, x):
            out = torch.empty_like(x)
            n = x.numel()
            grid = (n // 4 + 1,)
            kernel[grid](x, out, n, 1.0 / self.temperature, BLOCK=4)
            return out


    if __name__ == "__main__":
        Layer().forward(torch.randn(64))
""")


def test_the_call_alone_takes_its_plain_values_and_grid_from_the_probe():
    """A launch inside `forward(self, x)`: `n` and the grid come from the probe, bound to their
    names first (a named grid is the sanitizer's to judge, not the validity rules'); a computed
    argument with no name of its own (`1.0 / self.temperature`) takes its value in place."""
    focus = "kernel[grid](x, out, n, 1.0 / self.temperature, BLOCK=4)"
    context = PassContext(
        specs=(TensorSpec((64,)), TensorSpec((64,)), None, None),
        call_args=(None, None, 64, 0.5),
        call_grid=(17,),
        focus=focus,
    )
    (alone,) = candidates(jump_to_call, LAUNCHING_LAYER, context)
    assert alone.endswith(
        "n = 64\ngrid = (17,)\nkernel[grid](torch.randn((64,)), torch.randn((64,)), n, 0.5, BLOCK=4)\n"
    )
    assert "class Layer" not in alone and "class Kernel" in alone
    assert raises_bad(alone) == VALUE_ERROR
    unprobed = PassContext(specs=context.specs, call_grid=(17,), focus=focus)
    assert list(candidates(jump_to_call, LAUNCHING_LAYER, unprobed)) == []  # `n` unknown


def test_jump_to_call_binds_probed_plain_values_over_defaults():
    context = PassContext(
        named_specs=(("x", OFFSET_VIEW),),
        named_values=(("eps", 0.5), ("scale", (2, 3))),
        focus="out = kernel(x, scale) - mean + eps",
    )
    pruned = next(candidates(jump_to_call, TRAINING, context))
    assert "eps = 0.5\nscale = (2, 3)\n" in pruned


def test_a_candidate_with_random_tensors_draws_the_same_values_in_every_run():
    """jump_to_call's tensors from specs are seeded once, after the imports (a seed the code
    has at top level already is kept as it is)."""
    spec = TensorSpec((64,), dtype="int64", values=Generated("randint", 22, 1 << 33))
    context = PassContext(named_specs=(("x", spec),), focus="out = kernel(x, scale) - mean + eps")
    first = next(candidates(jump_to_call, TRAINING, context))
    assert first.count("torch.manual_seed(0)") == 1
    assert first.index("import torch") < first.index("torch.manual_seed(0)") < first.index("x =")
    drawn = []
    for _ in range(2):
        namespace: dict[str, object] = {"__name__": "candidate"}
        exec(first.split("mean = ")[0], namespace)
        drawn.append(namespace["x"])
    assert torch.equal(drawn[0], drawn[1])
    assert seeded(first) == first


def test_a_seed_costs_nothing_in_the_size_order():
    """Else a pass that replaces a tensor by a seeded random one would have to shrink the script
    by more than the seed line to be accepted (on the numpy_kernel case none was)."""
    code = "import torch\nx = torch.randn((4,))\nf(x)\n"
    assert sort_key(seeded(code)) == sort_key(code)
    assert seeded(code) != code


def test_the_fast_walk_lists_what_libcsts_children_and_findall_list_in_their_order() -> None:
    """reprocut.source.passes.walk reads node fields instead of libcst's visitors: the same
    nodes, in the same order, over every script of the corpus."""
    import libcst.matchers as m

    from reprocut.source.passes.walk import of_type, walk

    def by_children(node: cst.CSTNode):
        yield node
        for child in node.children:
            yield from by_children(child)

    scripts = sorted(Path(__file__).parents[1].glob("corpus/*/*.py"))
    assert len(scripts) > 20
    for script in scripts:
        module = cst.parse_module(script.read_text())
        assert [id(n) for n in walk(module)] == [id(n) for n in by_children(module)], script
        assert [id(n) for n in of_type(module, cst.Call)] == [
            id(n) for n in m.findall(module, m.Call())
        ], script


def test_jump_ahead_jumps_from_the_script_with_its_modules_pasted_in(tmp_path: Path):
    """The failing function lives in a sibling module: the jump is offered before the pasted
    script (whose check would rerun the training), made from the script as pasted."""
    from reprocut.source.passes import jump_ahead

    (tmp_path / "ops.py").write_text(
        textwrap.dedent("""
        import torch


        def kernel(x):
            if x.storage_offset() % 4:
                raise ValueError("bad")
            return x * 2


        def normalize(x):
            out = kernel(x) - x.mean()
            return out
    """)
    )
    script = code("""
        import torch

        from ops import normalize


        def main():
            for step in range(10):
                normalize(torch.randn(64)[step:])


        main()
    """)
    context = PassContext(search_dirs=(tmp_path,), named_specs=(("x", OFFSET_VIEW),),
                          focus="out = kernel(x) - x.mean()")  # fmt: skip
    jumps = list(candidates(jump_ahead, script, context))
    assert jumps, "no jump offered"
    first = jumps[0]
    assert "from ops import" not in first and "def main" not in first and "for step" not in first
    assert "def kernel(x):" in first and "out = kernel(x) - x.mean()" in first
    assert "storage_offset()" in first and "as_strided" in first  # the probed offset view
    # a script with no module of the user's to paste: nothing ahead of inline_sibling_imports
    assert list(candidates(jump_ahead, first, context)) == []


def test_hoist_subexpressions_offers_the_innermost_operand_of_arithmetic_first():
    """`(n + 256 - 1) // 256` -> `n` in one candidate, then the one-level steps; a call's parts
    are still offered a level at a time."""
    offered = list(
        candidates(hoist_subexpressions, "blocks = (n + 256 - 1) // 256\n", PassContext())
    )
    assert offered[:2] == ["blocks = n\n", "blocks = (n + 256 - 1)\n"]
    called = list(candidates(hoist_subexpressions, "row = next(iter(rows))\n", PassContext()))
    assert "row = rows\n" not in called[:1] and "row = iter(rows)\n" in called


def test_a_targeted_rewrite_makes_what_a_full_visit_makes() -> None:
    """`transform` walks a Targeted transformer down the paths to its nodes only; every
    integer and every argument of a nested script, changed that way, gives the text libcst's
    full visit gives (the transformer's `path` left unset visits every node)."""
    from reprocut.source.passes.expressions import _DropArg, _SetInteger, droppable_arguments
    from reprocut.source.passes.tree import parse, transform
    from reprocut.source.passes.walk import of_type

    source = code(
        """
        import torch

        def step(x, n=4):
            if n > 2:
                return torch.zeros(n, 3, dtype=torch.float32) + x[1:n]
            return [v * 2 for v in range(n, 8)]

        print(step(torch.ones(7), n=5), max(1, 2, key=abs))
        """
    )
    module = parse(source)
    assert module is not None
    rewrites = [_SetInteger(i, 0) for i in of_type(module, cst.Integer)]
    rewrites += [_DropArg(a) for a in droppable_arguments(source)]
    assert len(rewrites) > 12
    for rewrite in rewrites:
        targeted = transform(source, rewrite, module)
        rewrite.path = None
        assert targeted == module.visit(rewrite).code
        assert targeted is not None and targeted != source


def test_the_statements_of_a_module_are_listed_as_libcst_visits_them() -> None:
    """statements_of reads the tree from its fields; it must list what a libcst visitor lists:
    every statement in a block, in post-order, not an `elif` (a branch of its `if`)."""
    from reprocut.source.passes.tree import STATEMENT_TYPES, parse, statements_of

    class Reference(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: list[cst.CSTNode] = []
            self.elifs: set[int] = set()

        def visit_If(self, node: cst.If) -> None:
            if isinstance(node.orelse, cst.If):
                self.elifs.add(id(node.orelse))

        def on_visit(self, node: cst.CSTNode) -> bool:
            return not isinstance(node, cst.BaseExpression) and super().on_visit(node)

        def on_leave(self, original_node: cst.CSTNode) -> None:
            if isinstance(original_node, STATEMENT_TYPES) and id(original_node) not in self.elifs:
                self.found.append(original_node)

    source = code(
        """
        import torch

        class Net:
            def forward(self, x):
                if x > 0:
                    y = 1
                elif x < 0:
                    y = 2
                elif x == 0:
                    pass
                else:
                    y = 3
                return y

        for i in range(3):
            try:
                with open("f") as f:
                    f.read()
            except OSError:
                continue
            finally:
                x = lambda: 1
        else:
            while False: break
        """
    )
    module = parse(source)
    assert module is not None
    reference = Reference()
    module.visit(reference)
    listed = statements_of(module)
    assert [id(s) for s in listed] == [id(s) for s in reference.found]
    assert len(listed) > 15
