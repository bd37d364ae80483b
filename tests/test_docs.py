"""The repository's docs are self-contained: no pointers to background files outside the repository,
and every ``docs/*.md`` path (with its ``#anchor``) named in code, configs and docs exists.

Pure file reading, no imports of the package: this runs in well under a second.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED_DIRS = ("specbench", "conf", "docs", "scripts", "tests")
SCANNED_FILES = ("README.md", "Makefile")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints"}
THIS_FILE = Path(__file__).resolve()

# Background files that lived outside the repository (a clone cannot follow them), also in the short
# forms "ALGORITHMS 0.2b", "DESIGN.md §2", "ALGORITHMS R5".
OUTSIDE_REFERENCE = re.compile(
    r"DESIGN\.md|ALGORITHMS\.md|shared/papers"
    r"|\b(?:DESIGN|ALGORITHMS)\s+(?:§\s*|section\s+)?R?\d"
)
# A docs/...md path as text (code comments, configs, prose), optionally with an anchor.
DOCS_PATH = re.compile(r"(?<![\w./-])(docs/[\w./-]*?\.md)(?:#([\w-]+))?(?![\w/])")
# A relative Markdown link target: [text](target) or [text](target#anchor) or [text](#anchor).
MD_LINK = re.compile(r"\]\(([^()\s]+)\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def scanned_files() -> list[Path]:
    """Every text file the rule covers (this test excluded), sorted."""
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for folder in SCANNED_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if (
                path.is_file()
                and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)
                and path.resolve() != THIS_FILE
            ):
                files.append(path)
    return files


@cache
def text_of(path: Path) -> str | None:
    """The file's text, or None for binary files."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lowercase, punctuation except - and _ dropped,
    spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text).lower()  # inline HTML tags
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@cache
def anchors_of(path: Path) -> frozenset[str]:
    """Every anchor a Markdown file's headings (outside code fences) and HTML anchors produce."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in (text_of(path) or "").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        anchors.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            seen = counts.get(base, 0)
            counts[base] = seen + 1
            anchors.add(base if seen == 0 else f"{base}-{seen}")  # GitHub numbers repeated headings
    return frozenset(anchors)


def target_problem(path: Path, anchor: str | None) -> str | None:
    """Why ``path#anchor`` does not resolve, or None when it does."""
    if not path.exists():
        return "no such file or folder"
    if anchor and path.suffix == ".md" and anchor not in anchors_of(path):
        return f"no heading gives #{anchor}"
    return None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_slug_follows_github():
    assert slug("Warm-up") == "warm-up"
    assert slug("## `match`: greedy walk / sample-and-match".lstrip("# ")) == "match-greedy-walk--sample-and-match"
    assert slug("Reproduction targets (MT-Bench, A100, fp16)") == "reproduction-targets-mt-bench-a100-fp16"
    assert slug("1. Self-distilled data (shared by every trainer)") == "1-self-distilled-data-shared-by-every-trainer"
    assert slug("See [the loop](design.md#the-decode-loop)") == "see-the-loop"


def test_no_references_to_files_outside_the_repository():
    found = []
    for path in scanned_files():
        text = text_of(path)
        if text is None:
            continue
        for match in OUTSIDE_REFERENCE.finditer(text):
            found.append(f"{path.relative_to(ROOT)}:{line_of(text, match.start())}: {match.group(0)!r}")
    assert not found, "references to background files outside the repository (point at docs/ instead):\n" + "\n".join(
        found
    )


def test_docs_paths_and_anchors_exist():
    broken = []
    for path in scanned_files():
        text = text_of(path)
        if text is None:
            continue
        for match in DOCS_PATH.finditer(text):
            problem = target_problem(ROOT / match.group(1), match.group(2))
            if problem:
                broken.append(f"{path.relative_to(ROOT)}:{line_of(text, match.start())}: {match.group(0)}: {problem}")
    assert not broken, "docs paths that do not resolve:\n" + "\n".join(broken)


@pytest.mark.parametrize("scope", ["docs", "README.md"])
def test_relative_markdown_links_resolve(scope):
    root = ROOT / scope
    pages = sorted(root.rglob("*.md")) if root.is_dir() else [root]
    broken = []
    for page in pages:
        text = text_of(page) or ""
        for match in MD_LINK.finditer(text):
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            problem = target_problem(resolved, anchor or None)
            if problem:
                broken.append(f"{page.relative_to(ROOT)}:{line_of(text, match.start())}: ({target}): {problem}")
    assert not broken, "Markdown links that do not resolve:\n" + "\n".join(broken)
