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


def section(page: Path, heading: str) -> str:
    """The text under `## heading` up to the next heading of that level."""
    text = page.read_text()
    assert f"\n## {heading}\n" in text, f"{page.relative_to(REPO)} has no section '## {heading}'"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of the Markdown tables in `text` (header and rule rows left out)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows if not set(r[0]) <= set("-: ")][1:] if rows else []


def resolved_recipe(name: str, with_gpu: bool, monkeypatch) -> list[str]:
    """What a shipped cluster file runs, as the trainer guide's table writes it. Stand-in: the GPU probe's
    answer (this machine has none), for `resources.gpus_per_node: auto`; the loading and resolving are real."""
    from orchestrator.config import local_gpus
    from orchestrator.config.clusters import load_cluster

    monkeypatch.setattr(local_gpus, "visible_gpus", lambda environ=None: 1 if with_gpu else 0)
    run = load_cluster(name).config.run
    yes_no = {True: "yes", False: "no"}
    return [run.runtime.device, run.runtime.precision, "fast" if run.fast_step else "reference",
            yes_no[run.runtime.compile], yes_no[run.runtime.cuda_graph], run.runtime.kernels, run.optim.name]


def test_the_trainer_guides_recipe_table_says_what_each_shipped_cluster_runs(monkeypatch):
    """docs/trainer.md's "Which recipe runs what": every shipped cluster has a row (`local` also on a GPU),
    and each row's device, precision, step, compile, CUDA graphs, kernels and optimizer are what the file
    resolves to. A recipe changed without its row fails here, with the row to write."""
    from orchestrator.config.clusters import cluster_files

    rows = table_rows(section(REPO / "docs" / "trainer.md", "Which recipe runs what"))
    named = {}
    for row in rows:
        name, _, where = row[0].partition(" ")
        named[(name.strip("`"), where == "on a GPU")] = row[1:8]
    shipped = {name for name, path in cluster_files().items() if path.parent == REPO / "clusters"}
    assert {name for name, _ in named} == shipped and (("local", True) in named)
    for (name, with_gpu), cells in named.items():
        expected = resolved_recipe(name, with_gpu, monkeypatch)
        assert cells == expected, (f"docs/trainer.md: the row of `{name}`{' on a GPU' if with_gpu else ''} says {cells}; "
                                   f"the file resolves to: | {' | '.join(expected)} |")


def test_the_cluster_guides_key_table_lists_every_key():
    """docs/clusters.md's "The keys": a row per section of the cluster file (each run: section apart), every
    key it names exists, and every key of a section is named (or its dotted prefix is), unless the row
    ends its list with `...`."""
    from orchestrator.config.clusters import ClusterConfig
    from orchestrator.config.configfile import schema_keys

    schema: dict[str, set[str]] = {}
    for key in schema_keys(ClusterConfig):
        parts = key.rstrip(".").split(".")
        cut = 2 if parts[0] == "run" else 1
        schema.setdefault(".".join(parts[:cut]), set()).add(".".join(parts[cut:]))
    rows = {row[0].strip("`"): row[1] for row in table_rows(section(REPO / "docs" / "clusters.md", "The keys"))}
    assert set(rows) == set(schema), f"sections without a row: {set(schema) - set(rows)}; rows of no section: {set(rows) - set(schema)}"

    def covered(key: str, listed: set[str]) -> bool:
        return any(key == name or key.startswith(name + ".") for name in listed)

    for name, cell in rows.items():
        listed = set(re.findall(r"`([^`]+)`", cell))
        keys = schema[name] - {""}
        assert all(any(covered(k, {n}) for k in keys) for n in listed), f"`{name}` names keys it does not have: {listed}"
        if "..." not in cell:
            assert all(covered(k, listed) for k in keys), f"`{name}` leaves out {sorted(k for k in keys if not covered(k, listed))}"


def test_every_benchmark_script_is_named_in_the_contributors_guide():
    text = (REPO / "CONTRIBUTING.md").read_text()
    unnamed = [p.name for p in sorted((REPO / "benchmarks").glob("*.py")) if f"benchmarks/{p.name}" not in text]
    assert not unnamed, f"CONTRIBUTING.md's benchmark list leaves out {unnamed}"


DATE = re.compile(r"\b(?:19|20)\d\d-\d\d-\d\d\b|\b(?:January|February|March|April|May|June|July|August|September|October"
                  r"|November|December) \d{1,2}\b|\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b")


def test_the_readme_is_a_front_page():
    """At most 2,500 words and no date: the history lives in the records (a link's target may name one)."""
    text = (REPO / "README.md").read_text()
    assert len(text.split()) <= 2500, f"README.md has {len(text.split())} words; move depth into a guide under docs/"
    shown = re.sub(r"(\[[^\]]*\])\([^)\s]+\)", r"\1", text)
    assert not DATE.findall(shown), f"README.md names dates: {DATE.findall(shown)}; they belong in benchmarks/results/"
    assert DATE.findall("measured on 2026-11-28, or on November 28") == ["2026-11-28", "November 28"]


# headline figures as the pages state them now, each on exactly one page (its guide, or the README), with its
# record's link there: the fast step's GPU rate and the CPU step against Hugging Face's (docs/trainer.md), packing
# (docs/balance.md), the sweep of published logs (docs/compliance.md), CI's and the demo's time (README.md)
HEADLINE_FIGURES = ["733-739 sequences/s", "5.90×", "99.8 % real tokens", "3,361 logs", "about 13 minutes on 2 CPU cores",
                    "about 4 minutes on 2 CPU cores"]


def test_each_headline_figure_is_stated_on_exactly_one_page():
    """A figure told on two pages goes stale on one of them: the others link to where it is stated. A figure on
    no page fails too: a new measurement changed the page, and this list follows it."""
    texts = {p.relative_to(REPO).as_posix(): p.read_text() for p in pages() if p != RECORDS_INDEX}
    for figure in HEADLINE_FIGURES:
        on = [name for name, text in texts.items() if figure in " ".join(text.split())]
        assert on, f"{figure!r} is stated on no page: update HEADLINE_FIGURES to the figure the page states now"
        assert len(on) == 1, f"{figure!r} is stated on {on}: state it once and link there"
