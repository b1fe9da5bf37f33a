"""The docs hold together: every relative link in docs/ and the top-level Markdown files points
at a file that exists (and at a heading that exists, for ``#anchor`` links), and every generated
page is what its generator writes today."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from recsvc.app import docs as cli_docs

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")])
# Generated page → the function that renders it; each page names its command and says "do not edit".
GENERATED = {cli_docs.PAGE: cli_docs.render}  # whole pages; the status page's table: below

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, punctuation and symbols
    dropped (letters, digits, marks, '-' and '_' stay), each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = (c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may name on ``page``: its headings' slugs (repeats numbered as GitHub
    does) and explicit ``<a id=…>`` anchors."""
    seen: dict[str, int] = {}
    found = set()
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    for line in lines:
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2).replace("`", ""))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    out = []
    for line in _prose(page.read_text(encoding="utf-8")):
        out += LINK.findall(line)
        m = REFERENCE.match(line)
        if m:
            out.append(m.group(1))
    return out


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:: not checked offline
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{target}: no heading or anchor #{fragment} there")
    return problems


TREE = [
    "README.md",
    "CHANGELOG.md",
    "SECURITY.md",
    "docs/index.md",
    "docs/getting-started.md",
    "docs/conventions.md",
    "docs/concepts/privacy-model.md",
    "docs/concepts/mechanisms.md",
    "docs/concepts/privacy-proofs.md",
    "docs/concepts/auto.md",
    "docs/concepts/ledger.md",
    "docs/concepts/multi-selection.md",
    "docs/guides/offline-pipeline.md",
    "docs/guides/serving.md",
    "docs/guides/replicas-postgresql.md",
    "docs/guides/ledger-operations.md",
    "docs/guides/evaluation.md",
    "docs/reference/specification.md",
    "docs/reference/cli.md",
    "docs/reference/grpc-api.md",
    "docs/reference/status-codes.md",
    "docs/reference/artifact-format.md",
    "docs/reference/ledger-format.md",
    "docs/research/paper-reproduction.md",
    "docs/research/bandit-study.md",
    "docs/research/two-candidates.md",
    "docs/performance.md",
    "docs/decisions/0001-exact-epsilon-units.md",
    "docs/decisions/0002-group-commit.md",
    "docs/decisions/0003-optimistic-postgres-charges.md",
    "docs/decisions/0004-wire-prescan.md",
    "docs/archive/benchmarks-notebook.md",
]


def test_every_page_of_the_docs_tree_exists() -> None:
    """Page names are fixed so that code, docstrings and other pages can link to them."""
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert sorted(set(TREE) - names) == []


def test_the_specification_keeps_its_six_numbered_sections() -> None:
    """Code cites `docs/reference/specification.md §N`, so the numbers must not move."""
    found = anchors(ROOT / "docs" / "reference" / "specification.md")
    assert {
        "1-the-problem",
        "2-mechanisms",
        "3-randomness",
        "4-offline-pipeline",
        "5-grpc-service",
        "6-evaluation",
    } <= found


def test_the_readme_stays_an_overview() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "bash scripts/demo.sh" in text.split("##")[0] and "bash scripts/test.sh" in text.split("##")[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert broken(page) == []


@pytest.mark.parametrize("page", sorted(GENERATED), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_generated_page_is_fresh(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "do not edit" in text.split("\n\n")[1], "a generated page says so near its top"
    assert text == GENERATED[page](), f"{page.relative_to(ROOT)} is stale: run `{cli_docs.COMMAND}`"


def test_the_status_table_is_generated_from_the_service_errors() -> None:
    page = cli_docs.STATUS_PAGE
    text = page.read_text(encoding="utf-8")
    assert text == cli_docs.render_status(text), f"{page.relative_to(ROOT)} is stale: run `{cli_docs.COMMAND}`"
    table = text.split(cli_docs.STATUS_BEGIN)[1].split(cli_docs.STATUS_END)[0]
    assert "| `RESOURCE_EXHAUSTED` | 8 | BudgetExceeded, RateLimited, Overloaded |" in table
    assert len(table.strip().splitlines()) == 2 + len(cli_docs.STATUS_TABLE)


def test_the_generators_check_staleness_in_one_command() -> None:
    assert cli_docs.main(["--check"]) == 0


CODE_ROOTS = ("recsvc", "data_prep", "eval", "scripts", "tests", "proto")
CODE_CITATION = re.compile(r"docs/[\w./-]+?\.md(?:#[\w\-ε]+)?")


def test_docs_pages_cited_in_code_exist() -> None:
    """Source, tests and the proto cite docs pages by their path from the repository's root
    (``docs/reference/specification.md §2``, ``docs/concepts/auto.md#the-table``): each must
    resolve, anchor included."""
    problems = []
    for root in CODE_ROOTS:
        for path in sorted((ROOT / root).rglob("*")):
            if path.suffix not in (".py", ".proto", ".sh") or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                for cited in CODE_CITATION.findall(line):
                    page, _, fragment = cited.partition("#")
                    dest = ROOT / page
                    if not dest.exists():
                        problems.append(f"{path.relative_to(ROOT)}:{n}: {cited}: no such page")
                    elif fragment and fragment not in anchors(dest):
                        problems.append(f"{path.relative_to(ROOT)}:{n}: {cited}: no such anchor")
    assert problems == []


def test_the_link_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text('# Title: the `x` part\n\n## Same\n\n## Same\n\n<a id="here"></a>\n')
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#title-the-x-part) [ok](b.md#same-1) [ok](b.md#here) [ok](#local) [web](https://example.org/x)\n"
        "[gone](c.md) [bad anchor](b.md#nope) ![img](missing.png) [local](#absent)\n"
        "`[code](ignored.md)`\n```\n[fenced](ignored.md)\n```\n## Local\n"
    )
    assert broken(page) == [
        "c.md: no such file",
        "b.md#nope: no heading or anchor #nope there",
        "missing.png: no such file",
        "#absent: no heading or anchor #absent there",
    ]


def test_slugs_follow_github() -> None:
    assert (
        slug("`auto`: the best mechanism for each ε, from public data")
        == "auto-the-best-mechanism-for-each-ε-from-public-data"
    )
    assert slug("2. Mechanisms (names are the public API)") == "2-mechanisms-names-are-the-public-api"
    assert slug("Status codes — and what is spent") == "status-codes--and-what-is-spent"
