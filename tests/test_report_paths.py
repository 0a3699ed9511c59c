"""Paths as report.md and the panel show them: relative to a folder, never the home directory."""

from __future__ import annotations

import os

from reprocut.report.paths import relative_to_folder, shown_path, without_home

HOME = os.path.expanduser("~")


def test_project_files_are_relative_and_library_files_start_at_their_package():
    assert shown_path("/work/proj/train.py", "/work/proj") == "train.py"
    assert shown_path("/work/proj/src/model.py", "/work/proj/") == "src/model.py"
    library = "/opt/venv/lib/python3.11/site-packages/transformers/models/bert/modeling_bert.py"
    assert shown_path(library, "/work/proj") == "transformers/models/bert/modeling_bert.py"
    assert shown_path(f"{HOME}/elsewhere/x.py", "/work/proj") == "~/elsewhere/x.py"


def test_folder_and_home_are_replaced_only_where_they_are_whole_paths():
    text = "at /work/proj/train.py:3, in /work/proj, not /work/project/x.py"
    assert relative_to_folder(text, "/work/proj") == "at train.py:3, in ., not /work/project/x.py"
    assert without_home(f"{HOME}/a and {HOME}x/b") == f"~/a and {HOME}x/b"
