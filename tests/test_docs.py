"""The README and the docs site say what reprocut does today.

The site builds with `mkdocs build --strict`; the generated regions (the command reference, the
exit codes, the quoted repros and JSON) match what the tools write; every `reprocut` command the
pages write parses with reprocut's own parser; and the fenced `bash` blocks that run reprocut on
the bundled examples run on a CPU and exit as the docs say.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from docs_pages import (
    REPO,
    Block,
    blocks,
    documented_recording_files,
    pages,
    relative_links,
    reprocut_commands,
    runnable,
)

from reprocut import cli
from reprocut.model.errors import ExitCode

# Blocks the docs test does not run, by page and the mark on their first line. Keep this short:
# every other block that runs reprocut runs on the CPU.
EXPECTED_SKIPS = [
    ("docs/failures/custom-ops.md", "needs a GPU"),
    ("docs/failures/device-asserts.md", "needs a GPU"),
    ("docs/failures/memory-faults.md", "needs a GPU"),
    ("docs/failures/torch-compile.md", "slow"),
]
BLOCK_TIMEOUT = 600
WORKERS = max(2, min(4, os.cpu_count() or 2))


def load_tool(name: str):
    """A module of docs/tools/ (a folder of scripts, not a package)."""
    path = REPO / "docs" / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_tools_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_ci_runs_the_readme_test_command_exactly():
    readme = next(
        b.text.strip() for b in blocks(REPO / "README.md") if "python -m pytest" in b.text
    )
    ci = next(
        line
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if "pytest" in line and "pip install" in line
    )
    assert ci.replace("python -m pip install -q", "pip install") == readme
    assert '".[test,docs]"' in readme  # the site's strict build is one of the tests


def test_the_readme_links_each_failure_page_and_each_page_has_an_example():
    failure_pages = sorted((REPO / "docs" / "failures").glob("*.md"))
    linked = {(REPO / link).resolve() for link in relative_links(REPO / "README.md")}
    assert [p for p in failure_pages if p.resolve() not in linked] == []
    for page in failure_pages:
        assert any(b.language == "bash" and b.invokes_reprocut() for b in blocks(page)), page


def test_every_relative_link_of_the_readme_and_the_pages_points_at_a_file():
    broken = []
    for page in pages():
        for link in relative_links(page):
            target = (page.parent / link.split("#")[0]).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(REPO)}: {link}")
    assert broken == []


def test_generated_regions_are_current():
    done = subprocess.run(
        [sys.executable, "docs/tools/sync.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_exit_code_page_has_every_exit_code_with_the_help_text_meaning():
    reference = load_tool("reference")
    meanings = reference.exit_code_meanings()
    assert sorted(meanings) == sorted(int(code) for code in ExitCode)
    page = (REPO / "docs" / "reference" / "exit-codes.md").read_text()
    for code in ExitCode:
        assert (
            f"| {int(code)} | `{code.name}` | {reference.markdown_cell(meanings[code])} |" in page
        )


def test_every_reprocut_command_the_docs_write_parses():
    """Parsed as `reprocut` parses it, and every option spelled out in full: argparse would take
    a renamed `--max-time-s`'s old name `--max-time` as its abbreviation."""
    reference = load_tool("reference")
    commands = [(page, args) for page in pages() for args in reprocut_commands(page)]
    assert len(commands) > 40  # the collection finds them
    refused = []
    for page, args in commands:
        name = args[0] if args and args[0] in cli.COMMANDS else ""
        where = f"{page.relative_to(REPO)}: reprocut {shlex.join(args)}"
        try:
            options = cli._parse(cli.build_parser(name), args)
        except SystemExit as exc:
            if exc.code:
                refused.append(where)
            continue
        own = args[1 : len(args) - len(getattr(options, "launch_args", []))]
        known = reference.command_parser(name)._option_string_actions if name else {}
        refused += [
            f"{where} ({word} is not spelled in full)"
            for word in own
            if word.startswith("--") and word != "--" and word.split("=")[0] not in known
        ]
    assert refused == []


def test_the_site_builds_with_strict_checks(tmp_path: Path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e .[docs]")
    pytest.importorskip("material", reason="the docs extra is not installed")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about MkDocs 2
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for page in (REPO / "docs" / "failures").glob("*.md"):
        assert (site / "failures" / page.stem / "index.html").is_file()
    started = (site / "getting-started" / "index.html").read_text()
    assert "../assets/embedding/record.svg" in started
    # a link to a repository file outside docs/ points at the copy the hook put in the site
    copied = site / "repo" / "benchmarks" / "results" / "faults-cuda.md"
    assert copied.read_text() == (REPO / "benchmarks" / "results" / "faults-cuda.md").read_text()
    memory_faults = (site / "failures" / "memory-faults" / "index.html").read_text()
    assert 'href="../../repo/benchmarks/results/faults-cuda.md"' in memory_faults


def shell_script(block: Block) -> str:
    """The block's commands, each followed by a check of its exit code."""
    lines = ["set -u"]
    for command, expected in runnable(block):
        message = shlex.quote(f"expected exit {expected}: {command}")
        lines += [
            command,
            f'rc=$?; [ "$rc" -eq {expected} ] || {{ echo "exit $rc, "{message} >&2; exit 1; }}',
        ]
    return "\n".join(lines)


def shell_env(work: Path) -> dict[str, str]:
    """The environment a block runs in: `reprocut` is this checkout's, run by this Python."""
    shims = work / ".bin"
    shims.mkdir(parents=True)
    shim = shims / "reprocut"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m reprocut "$@"\n')
    shim.chmod(0o755)
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(shims), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def run_block(block: Block, work: Path) -> str | None:
    """Run one block in its own copy of examples/ and corpus/; a failure's description."""
    for top in ("examples", "corpus"):
        shutil.copytree(REPO / top, work / top)
    try:
        done = subprocess.run(
            ["bash", "-c", shell_script(block)],
            cwd=work,
            env=shell_env(work),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"{block.name}: ran past {BLOCK_TIMEOUT} s"
    if done.returncode != 0:
        return f"{block.name}:\n{done.stderr[-3000:]}"
    return None


def recording_files(work: Path) -> set[str]:
    """The names in every recording folder the block left (a torchrun job's ranks too)."""
    names = set()
    for run in work.rglob(".reprocut/runs/*"):
        for folder in (run, *run.glob("ranks/*")):
            names.update(path.name for path in folder.iterdir())
    return names


def shell_blocks() -> list[Block]:
    """Every fenced bash block that runs reprocut, the README's and a page's same block once."""
    found: dict[tuple, Block] = {}
    for page in pages():
        for block in blocks(page):
            if block.language == "bash" and block.invokes_reprocut():
                found.setdefault(tuple(runnable(block)), block)
    return list(found.values())


def run_blocks(to_run: list[Block], tmp_path: Path) -> list[Path]:
    """Run the blocks several at once, each in its own folder; those folders."""
    works = [tmp_path / f"block{i}" for i in range(len(to_run))]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        failures = [f for f in pool.map(run_block, to_run, works) if f is not None]
    assert failures == [], "\n\n".join(failures)
    return works


def test_only_the_listed_blocks_are_skipped_on_the_cpu():
    skipped = sorted(
        (str(b.page.relative_to(REPO)), b.skip_reason) for b in shell_blocks() if b.skip_reason
    )
    assert skipped == EXPECTED_SKIPS


@pytest.mark.slow
def test_the_docs_commands_run_on_the_cpu(tmp_path: Path):
    to_run = [b for b in shell_blocks() if not b.skip_reason]
    assert len(to_run) >= 9  # getting started and every CPU failure class
    works = run_blocks(to_run, tmp_path)
    documented = documented_recording_files()
    undocumented = {
        name
        for work in works
        for name in recording_files(work)
        if not any(fnmatch.fnmatch(name, pattern) for pattern in documented)
    }
    assert undocumented == set(), "files of a recording that docs/reference/recordings.md omits"


@pytest.mark.cuda
@pytest.mark.slow
def test_the_docs_gpu_commands_run_on_a_gpu(tmp_path: Path):
    to_run = [b for b in shell_blocks() if b.skip_reason == "needs a GPU"]
    assert len(to_run) == 3
    run_blocks(to_run, tmp_path)
