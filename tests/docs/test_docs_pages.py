"""The README stays a front page, and the docs stand alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_a_front_page_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "bash platform/up" in readme
    assert "bash platform/test" in readme


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_a_file_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "../shared/" not in text
    assert not re.search(r"DESIGN(\.md| §)", text)


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    missing = sorted(p for p in pages if p not in nav)
    assert not missing, f"add these pages to mkdocs.yml's nav: {missing}"
