"""The README, docs/ (with the records in docs/research/), benchmarks/README.md and the model card stand
alone: every relative link names a file inside the repository, and every ``#anchor`` names a heading of the
page it points to (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs/research").glob("*.md"),
                ROOT / "benchmarks/README.md", ROOT / "src/doppler/policy/pretrained/MODEL_CARD.md"])
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((i, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than ``-`` and ``_`` dropped,
    each space a ``-``."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f"{s}-{k}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    out = []
    for i, line in prose_lines(page.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        out += [(i, m.group(1)) for m in LINK.finditer(line)]
    return out


def test_the_pages_exist_and_have_links() -> None:
    assert (ROOT / "README.md") in PAGES and len(PAGES) >= 10
    assert (ROOT / "docs/research/generalization_log.md") in PAGES
    assert sum(len(links(p)) for p in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    bad = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{line}: {target}"
        if ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{where} points outside the repository")
        elif not dest.exists():
            bad.append(f"{where} names a missing file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where} names no heading of {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_path_of_the_development_machine(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"\.\./shared|/work/|/tmp/bash_jobs", text), page


def test_slugs_follow_github() -> None:
    assert slug("Training distribution and held-out split (`doppler.workloads.corpus`)") == \
        "training-distribution-and-held-out-split-dopplerworkloadscorpus"
    assert slug("A teacher past HEFT: HEFT_LOOKAHEAD (twenty-first session)") == \
        "a-teacher-past-heft-heft_lookahead-twenty-first-session"
    assert slug("`doppler assign --method doppler` without torch") == "doppler-assign---method-doppler-without-torch"
