"""The code cites its own design page and the papers, never a file outside the repository or an
issue number; the design page exists and the book and the README link it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["blink_edu", "notebooks", "tools", "tests", "book"]
# an outside design file, a path out of the checkout, or an issue of the tracker
FORBIDDEN = re.compile(r"DESIGN(\.md)?\s*§|\.\./shared|\b[Ii]ssues? #?\d+\b|\(#\d+\)")
# files whose citations the lead rewrites together with their own changes (the sed commands are
# in the merge notes of this change); empty this set once they are applied
SELF = "tests/test_citations.py"  # its examples of what is refused


def scanned_files():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".ipynb", ".md") and "_build" not in path.parts \
                    and "chapters" not in path.relative_to(ROOT).parts[:2]:
                yield path


def test_no_file_cites_an_outside_file_or_an_issue_number():
    found = []
    for path in scanned_files():
        name = path.relative_to(ROOT).as_posix()
        if name == SELF:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert found == []


@pytest.mark.parametrize("text", ["DESIGN.md §4", "see ../shared/x", "issue #8", "Issue 7;",
                                  "(#12)"])
def test_the_check_catches(text):
    assert FORBIDDEN.search(text)


def test_the_design_page_is_linked_from_the_readme_and_the_book():
    design = ROOT / "docs" / "design.md"
    sections = re.findall(r"^## (\d+)\. ", design.read_text(), flags=re.M)
    assert sections == [str(n) for n in range(1, 10)]
    cited = {int(n) for path in scanned_files()
             for n in re.findall(r"docs/design\.md §(\d+)", path.read_text())}
    assert cited and cited <= set(range(1, 10))  # every section cited exists
    assert "(docs/design.md)" in (ROOT / "README.md").read_text()
    assert "../docs/design.md" in (ROOT / "book" / "design.md").read_text()
    assert "\ndesign\n" in (ROOT / "book" / "index.md").read_text()
