"""MkDocs hook: files the pages show as they are, never rendered as pages.

Two kinds. A markdown file under `assets/` (a report.md that `reprocut shrink` wrote) is data: it
is copied into the site as it is. And a page may link to a repository file outside docs/ (a
result file, an example script) by its relative path, which is right on GitHub and in a checkout;
the site gets a copy of each such file under `repo/`, and the link is pointed at that copy. So
every link works in the site too, and `mkdocs build --strict` still fails on a link to a file
that does not exist.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
ASSETS = "assets/"
COPIES = "repo"


class AsIs(File):
    """A file served as it is, a markdown file included."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def repo_root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def outside_target(config: MkDocsConfig, page_uri: str, link: str) -> str | None:
    """The repository-relative path a page's link points to, when that is an existing file
    outside docs/; None for links inside docs/, to other sites, or to nothing."""
    if ":" in link or link.startswith("/"):
        return None
    docs = Path(config.docs_dir).resolve()
    repo = repo_root(config)
    target = (docs / posixpath.dirname(page_uri) / link).resolve()
    if target.is_relative_to(docs) or not target.is_relative_to(repo) or not target.is_file():
        return None
    return target.relative_to(repo).as_posix()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for file in list(files):
        if file.src_uri.startswith(ASSETS) and file.is_documentation_page():
            files.remove(file)
            files.append(AsIs(file.src_uri, file.src_dir, file.dest_dir, file.use_directory_urls))
    linked: set[str] = set()
    for page in files.documentation_pages():
        for match in LINK.finditer(page.content_string):
            target = outside_target(config, page.src_uri, match[2])
            if target is not None:
                linked.add(target)
    for target in sorted(linked):
        path = str(repo_root(config) / target)
        files.append(AsIs.generated(config, f"{COPIES}/{target}", abs_src_path=path))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def point_at_copy(match: re.Match[str]) -> str:
        target = outside_target(config, page.file.src_uri, match[2])
        if target is None:
            return match[0]
        relative = posixpath.relpath(f"{COPIES}/{target}", posixpath.dirname(page.file.src_uri))
        return f"{match[1]}{relative}{match[3]}"

    return LINK.sub(point_at_copy, markdown)
