"""The pages hold together: every relative link between them (to a page, a file of the repository or a
heading's #anchor) resolves, and the index of measurement records lists every record. (The commands the
pages show are run by tests/test_readme.py.)"""

import re
from pathlib import Path

import pytest
from conftest import REPO

RECORDS = REPO / "benchmarks" / "results"
RECORDS_INDEX = RECORDS / "README.md"


def pages() -> list[Path]:
    """The Markdown a user or contributor reads: the front page, the guides, the maps, the records' index."""
    found = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "CONTRIBUTING.md", RECORDS_INDEX]
    return [p for p in found if p.is_file()] + sorted((REPO / "docs").rglob("*.md"))


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$", re.M)


def prose(text: str) -> str:
    """The text without code blocks and code spans (a `[x](y)` shown as code is not a link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, without punctuation, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, the second of two equal headings getting -1 as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def links(text: str) -> list[str]:
    return LINK.findall(prose(text))


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """The relative links of `page` that lead nowhere: a missing file, a path outside the repository,
    or an #anchor that no heading of the target page has."""
    text = page.read_text() if text is None else text
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here (no network)
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in anchors(text):
                broken.append(f"{target}: no heading #{anchor} on this page")
            continue
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(REPO.resolve()) or not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved.read_text())):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return broken


def test_the_pages_are_found():
    names = {p.relative_to(REPO).as_posix() for p in pages()}
    assert {"README.md", "ARCHITECTURE.md", "benchmarks/results/README.md"} <= names


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    assert not broken_links(page), f"{page.relative_to(REPO)}: broken links: {broken_links(page)}"


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    """The checker itself: a missing file, a missing anchor and a path out of the repository are found;
    a link shown as code is not a link; GitHub's anchors (punctuation dropped, repeats numbered) resolve."""
    page = REPO / "docs" / "example.md"  # never written: links resolve from where the page would be
    text = ("# The trainer, and the fast paths\n## Setup\n## Setup\n"
            "[a](../README.md) [b](#the-trainer-and-the-fast-paths) [c](#setup-1) `[d](nowhere.md)`\n"
            "[e](nowhere.md) [f](#no-such-heading) [g](../../outside.md) [h](https://example.com)\n")
    assert [b.split(":")[0] for b in broken_links(page, text)] == ["nowhere.md", "#no-such-heading", "../../outside.md"]


def record_files() -> list[str]:
    """Every file under benchmarks/results/ but the index itself, as paths relative to it."""
    return sorted(p.relative_to(RECORDS).as_posix() for p in RECORDS.rglob("*") if p.is_file() and p != RECORDS_INDEX)


def test_the_records_index_lists_every_record():
    """A record without a line in the index fails here: say what it measured, when and its headline."""
    listed = {target.partition("#")[0] for target in links(RECORDS_INDEX.read_text())}
    missing = [name for name in record_files() if name not in listed]
    assert len(record_files()) > 20 and not missing, f"benchmarks/results/README.md lists no line for {missing}"
