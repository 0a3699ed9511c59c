"""Launching like python: `record SCRIPT`, `record -m MODULE`, `record -- python ...`.

The parsing is checked token by token; then a script that prints what it sees (sys.argv,
sys.path[0], __name__, __spec__) is run under plain python and under `reprocut record`, as a
script and as a module, and what it saw must be identical.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.cli import main
from reprocut.commands.record import split_args
from reprocut.model.errors import ExitCode
from reprocut.model.launch import Launch, LaunchError
from reprocut.record.parent.launch import locate, module_file, parse_launch

SHOW = """\
import json, os, sys
seen = {"argv": sys.argv, "path0": sys.path[0], "name": __name__, "package": __package__,
        "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
        "main": sys.modules["__main__"].__dict__ is globals(),
        "builtins": type(__builtins__).__name__}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.json"), "w") as out:
    json.dump(seen, out)
"""


def test_reprocut_options_end_at_the_script_and_its_arguments_are_untouched():
    assert split_args(["--timeout", "5", "train.py", "--json", "--", "-m", "x"]) == (
        ["--timeout", "5"],
        ["train.py", "--json", "--", "-m", "x"],
    )
    assert split_args(["--json", "--root=r", "--time", "3", "t.py"]) == (
        ["--json", "--root=r", "--time", "3"],  # a unique prefix takes its value, as argparse's
        ["t.py"],
    )


def test_the_launch_starts_at_dash_m_or_at_the_double_dash():
    assert split_args(["--quiet", "-m", "pkg.train", "--quiet"]) == (
        ["--quiet"],
        ["-m", "pkg.train", "--quiet"],
    )
    assert split_args(["--json", "--", "python", "-m", "pkg"]) == (
        ["--json"],
        ["--", "python", "-m", "pkg"],
    )


def test_parse_launch_reads_the_three_spellings():
    assert parse_launch(["train.py", "a", "--", "b"]) == Launch(
        script=Path("train.py"), args=("a", "--", "b"), argv0="train.py"
    )
    assert parse_launch(["-m", "pkg.train", "--lr", "3"]) == Launch(
        module="pkg.train", args=("--lr", "3")
    )
    assert parse_launch(["-mpkg.train"]) == Launch(module="pkg.train")
    assert parse_launch(["--", "python3", "-u", "-W", "ignore", "-m", "pkg", "x"]) == Launch(
        module="pkg", args=("x",), python_options=("-u", "-W", "ignore")
    )
    assert parse_launch(["--", sys.executable, "t.py", "--", "y"]) == Launch(
        script=Path("t.py"), args=("--", "y"), argv0="t.py"
    )
    assert parse_launch(["--", "t.py", "z"]) == Launch(
        script=Path("t.py"), args=("z",), argv0="t.py"
    )


@pytest.mark.parametrize(
    "tokens",
    [[], ["--"], ["--", "python"], ["-m"], ["--", "python", "-c", "print(1)"], ["--bogus"]],
)
def test_a_launch_that_runs_nothing_is_a_usage_error(tokens):
    with pytest.raises(LaunchError) as raised:
        parse_launch(tokens)
    assert raised.value.exit_code == ExitCode.USAGE_ERROR


def test_modules_are_found_as_python_finds_them_without_importing_them(tmp_path):
    package = tmp_path / "pkg"
    (package / "tool").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (package / "train.py").write_text("")
    (package / "tool" / "__main__.py").write_text("")
    assert module_file("pkg.train", tmp_path) == str(package / "train.py")
    assert module_file("pkg.tool", tmp_path) == str(package / "tool" / "__main__.py")
    assert module_file("pkg.missing", tmp_path) is None
    located = locate(parse_launch(["-m", "pkg.train", "a"]), tmp_path)
    assert located.script == package / "train.py" and located.argv0 == str(package / "train.py")


def test_record_without_a_script_or_with_an_unknown_module_is_a_usage_error(tmp_path, capsys):
    assert main(["record", "--root", str(tmp_path)]) == ExitCode.USAGE_ERROR
    assert "no script to run" in capsys.readouterr().err
    assert main(["record", "--root", str(tmp_path), "-m", "no_such_mod_x"]) == ExitCode.USAGE_ERROR
    assert "no module named no_such_mod_x" in capsys.readouterr().err


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "show.py").write_text(SHOW)
    (root / "show.py").write_text(SHOW)
    return root


def _seen(project: Path, command: list[str], seen_dir: Path) -> dict:
    seen = seen_dir / "seen.json"
    seen.unlink(missing_ok=True)
    subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=300, check=False)
    assert seen.exists(), f"{command} did not run the script"
    return json.loads(seen.read_text())


@pytest.mark.parametrize(
    ("python_form", "reprocut_forms", "where"),
    [
        (
            ["show.py", "a", "--", "--json"],
            [["show.py", "a", "--", "--json"], ["--", "python", "show.py", "a", "--", "--json"]],
            ".",
        ),
        (
            ["-m", "pkg.show", "a", "--", "-m"],
            [
                ["-m", "pkg.show", "a", "--", "-m"],
                ["--", "python", "-m", "pkg.show", "a", "--", "-m"],
            ],
            "pkg",
        ),
    ],
    ids=["script", "module"],
)
def test_the_script_sees_what_plain_python_shows_it(
    project, python_form, reprocut_forms, where, tmp_path
):
    expected = _seen(project, [sys.executable, *python_form], project / where)
    for form in reprocut_forms:
        command = [sys.executable, "-m", "reprocut", "record", "--quiet", "--root", str(tmp_path)]
        assert _seen(project, [*command, *form], project / where) == expected, form


FAILING_MODULE = """\
import torch

table = torch.nn.Embedding(5, 2)
for step in range(3):
    ids = torch.tensor([1, 5 if step == 2 else 4])
    table(ids).sum().backward()
"""


def test_a_module_run_with_dash_m_is_localized_in_its_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "fails.py").write_text(FAILING_MODULE)
    monkeypatch.chdir(tmp_path)
    code = main(["record", "--json", "--quiet", "--root", str(tmp_path / "r"), "-m", "pkg.fails"])
    report = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK, report
    assert report["op"] == "aten::embedding"
    assert report["source"]["file"] == str(tmp_path / "pkg" / "fails.py")
    assert report["source"]["line"] == 6
    assert report["loop"] == {"step": 2}
