"""The emitter: exact text of small cases, and every emitted script compiles and runs on CPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reprocut.model.case import (
    ArgList,
    Captured,
    Generated,
    Literal,
    ReproCase,
    Signature,
    Symbol,
    TensorSpec,
)
from reprocut.model.errors import EmitError
from reprocut.shrink.emitter import SIDECAR_NAME, count_statements, emit, inline_captured
from reprocut.shrink.header import Environment, Header
from reprocut.shrink.nodes import literal

EMBEDDING_SIGNATURE = Signature("IndexError", None, "aten::embedding", "index out of range in self")


def body_of(code: str) -> str:
    """The text from `import torch` on (the header is tested separately)."""
    return code[code.index("import ") :]


def embedding_case(ids: tuple[int, ...] = (1000,), rows: int = 10) -> ReproCase:
    return ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((len(ids),), dtype="int64", values=Literal(ids)),
            TensorSpec((rows, 3), values=Generated("zeros")),
        ),
        expected=EMBEDDING_SIGNATURE,
        aten_op="aten::embedding",
    )


def test_embedding_case_exact_text() -> None:
    emitted = emit(embedding_case())
    assert body_of(emitted.code) == (
        "import torch\n"
        "\n"
        "\n"
        "def main():\n"
        "    ids = torch.tensor([1000])\n"
        "    weight = torch.zeros(10, 3)\n"
        "    torch.nn.functional.embedding(ids, weight)\n"
        "\n"
        "\n"
        'if __name__ == "__main__":\n'
        "    main()\n"
    )
    assert emitted.statements == 3
    assert count_statements(emitted.code) == 3


def test_cuda_case_synchronizes_and_names_device() -> None:
    case = ReproCase(
        "torch.gather",
        (
            TensorSpec((4, 3), device="cuda", values=Generated("randn")),
            1,
            TensorSpec((1, 1), dtype="int64", device="cuda", values=Literal((5,))),
        ),
    )
    text = body_of(emit(case).code)
    assert "    torch.manual_seed(0)\n" in text
    assert '    x = torch.randn(4, 3, device="cuda")\n' in text
    assert '    index = torch.tensor([[5]], device="cuda")\n' in text
    assert "    torch.gather(x, 1, index)\n    torch.cuda.synchronize()\n" in text


def test_strided_view_with_offset_uses_as_strided_and_copies_values() -> None:
    spec = TensorSpec(
        (2, 2), stride=(1, 2), storage_offset=1, dtype="int64", values=Literal((0, 5, 1, 2))
    )
    case = ReproCase("torch.gather", (TensorSpec((4, 3), values=Generated("zeros")), 1, spec))
    text = body_of(emit(case).code)
    assert "    index = torch.zeros(5, dtype=torch.int64).as_strided((2, 2), (1, 2), 1)\n" in text
    assert "    index.copy_(torch.tensor([[0, 5], [1, 2]]))\n" in text


def test_method_target_and_getitem() -> None:
    method = ReproCase(
        "torch.Tensor.scatter_add_",
        (
            TensorSpec((4,), values=Generated("zeros")),
            0,
            TensorSpec((1,), dtype="int64", values=Literal((9,))),
            TensorSpec((1,), values=Generated("ones")),
        ),
    )
    assert "    x.scatter_add_(0, index, src)\n" in emit(method).code
    getitem = ReproCase(
        "torch.Tensor.__getitem__",
        (
            TensorSpec((3,), values=Generated("zeros")),
            ArgList((TensorSpec((1,), dtype="int64", values=Literal((7,))), None)),
        ),
    )
    code = emit(getitem).code
    assert "    x[key0, None]\n" in code


def test_nan_and_inf_literals_and_symbols() -> None:
    assert literal(float("nan")).__class__.__name__ == "Call"
    case = ReproCase(
        "torch.multinomial",
        (TensorSpec((3,), values=Literal((float("nan"), -math.inf, 0.5))), 1),
        kwargs=(("replacement", False),),
    )
    code = emit(case).code
    assert 'torch.tensor([float("nan"), -float("inf"), 0.5])' in code
    cast = ReproCase(
        "torch.Tensor.to", (TensorSpec((2,), values=Generated("zeros")), Symbol("torch.float16"))
    )
    assert "x.to(torch.float16)" in emit(cast).code


def test_header_states_signature_environment_data_and_cpu() -> None:
    header = Header(
        expected=Signature("AcceleratorError", 710, "aten::embedding", "index out of bounds"),
        message="CUDA error: device-side assert triggered",
        assertion="index out of bounds",
        environment=Environment(
            torch="2.11.0", cuda="13.0", driver="580.1", gpu="NVIDIA H200", python="3.12.3"
        ),
        cpu_reproduces=True,
        cpu_message="IndexError: index out of range in self",
    )
    code = emit(embedding_case(), header).code
    head = code[: code.index("import torch")]
    assert (
        "Expected: AcceleratorError (CUDA error 710) in aten::embedding: index out of bounds"
        in head
    )
    assert "torch 2.11.0, CUDA 13.0, driver 580.1" in head
    assert "GPU NVIDIA H200, Python 3.12.3" in head
    assert "Data: mixed" in head
    assert "CPU: reproduces too (IndexError: index out of range in self)" in head


def test_captured_values_inline_when_small_and_sidecar_when_large(tmp_path: Path) -> None:
    small = ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((3,), dtype="int64", values=Captured("ids")),
            TensorSpec((10, 2), values=Generated("zeros")),
        ),
    )
    inputs = {"ids": torch.tensor([1, 2, 30])}
    inlined = inline_captured(small, inputs)
    assert inlined.args[0].values == Literal((1, 2, 30))
    big = ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((300,), dtype="int64", values=Captured("ids")),
            TensorSpec((10, 2), values=Generated("zeros")),
        ),
    )
    emitted = emit(inline_captured(big, {"ids": torch.arange(300)}))
    assert emitted.sidecar_keys == ("ids",)
    assert 'pathlib.Path(__file__).with_name("repro_inputs.pt")' in emitted.code
    ids = torch.arange(300)
    ids[7] = 99
    torch.save({"ids": ids}, tmp_path / SIDECAR_NAME)
    (tmp_path / "repro.py").write_text(emitted.code)
    result = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert "IndexError: index out of range in self" in result.stderr


def test_unknown_generator_is_an_emit_error() -> None:
    case = ReproCase("torch.abs", (TensorSpec((2,), values=Generated("bogus")),))
    with pytest.raises(EmitError):
        emit(case)


RUNNABLE = [
    embedding_case(),
    ReproCase(
        "torch.nn.functional.cross_entropy",
        (
            TensorSpec((2, 3), dtype="float16", values=Generated("randn")),
            TensorSpec((2,), dtype="int64", values=Literal((0, 7))),
        ),
    ),
    ReproCase(
        "torch.nn.functional.one_hot", (TensorSpec((2,), dtype="int64", values=Literal((1, 5))), 3)
    ),
    ReproCase(
        "torch.gather",
        (
            TensorSpec((3, 4), stride=(1, 3), values=Generated("arange")),
            1,
            TensorSpec(
                (2, 2), stride=(1, 2), storage_offset=1, dtype="int64", values=Literal((0, 5, 1, 2))
            ),
        ),
    ),
    ReproCase("torch.multinomial", (TensorSpec((2,), values=Literal((float("nan"), 0.5))), 1)),
    ReproCase(
        "torch.nn.functional.binary_cross_entropy",
        (
            TensorSpec((2,), values=Literal((1.5, 0.5)), requires_grad=True),
            TensorSpec((2,), values=Generated("rand")),
        ),
    ),
    ReproCase(
        "torch.Tensor.__getitem__",
        (
            TensorSpec((3,), values=Generated("full", 2.0)),
            TensorSpec((1,), dtype="int64", values=Literal((-9,))),
        ),
    ),
    ReproCase(
        "torch.Tensor.index_select",
        (
            TensorSpec((3, 2), dtype="int32", values=Generated("randint", 0, 5)),
            0,
            TensorSpec((1,), dtype="int64", values=Literal((3,))),
        ),
    ),
]


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda case: case.target.rsplit(".", 1)[-1])
def test_every_emitted_script_compiles_and_runs_on_cpu(case: ReproCase, tmp_path: Path) -> None:
    emitted = emit(case)
    compile(emitted.code, "repro.py", "exec")
    (tmp_path / "repro.py").write_text(emitted.code)
    result = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    # every case above is a real bug on CPU: the script must die with a torch error, not a NameError
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.split(":")[0] in ("IndexError", "RuntimeError", "ValueError"), result.stderr


def test_expanded_view_is_built_by_storage_position_and_runs(tmp_path: Path) -> None:
    """Copying into a stride-0 view is refused by torch: the values go into the storage."""
    positions = TensorSpec(
        (3, 5), stride=(0, 1), dtype="int64", values=Literal((0, 1, 2, 3, 70) * 3)
    )
    table = TensorSpec((64, 4), values=Generated("randn"))
    code = emit(ReproCase("torch.nn.functional.embedding", (positions, table))).code
    assert "ids_storage[torch.arange(5).as_strided((3, 5), (0, 1)).reshape(-1)] = " in code
    assert "ids = ids_storage.as_strided((3, 5), (0, 1))" in code
    script = tmp_path / "repro.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.stderr.strip().splitlines()[-1] == "IndexError: index out of range in self"
