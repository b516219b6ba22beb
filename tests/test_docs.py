"""The README is a landing page and docs/ the reference: every link between them resolves.

A page moved or a heading renamed would leave a newcomer at a dead link; this keeps the
README's and docs/'s relative links (and their #anchors, as GitHub spells them) pointing
at files and headings that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "gallery" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def _text_outside_code(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(_text_outside_code(page)):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_docs_contents_list_every_page():
    contents = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert {p for p in pages if f"]({p})" not in contents} == set()


def test_the_readme_is_a_landing_page_with_its_sections_in_order():
    text = (ROOT / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:2] == ["Quick start", "The first report, explained"]
    assert "Gate your own engine" in headings and headings[-1] == "Documentation"
    assert len(text.splitlines()) < 200, "the reference belongs in docs/"
