"""The mechanisms table of docs/concepts/mechanisms.md, generated from the registry.

``python -m recsvc.mechanisms.docs --write`` rewrites the table between the page's markers;
``--check`` exits 1 when it is stale (tests/mechanisms/test_docs_table.py runs the same check).
Each row shows a mechanism's privacy declaration (map, neighbours, audit, proof link) beside its
parameters and definition, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from dataclasses import dataclass
from pathlib import Path

from recsvc.mechanisms.mechanism import Mechanism
from recsvc.mechanisms.privacy import AuditKind, Neighbouring, Privacy, pure
from recsvc.mechanisms.registry import MECHANISMS
from recsvc.settings import add_arguments, from_namespace, setting

PAGE = Path("docs/concepts/mechanisms.md")  # relative to the repository root
BEGIN = "<!-- BEGIN mechanism-table -->"
END = "<!-- END mechanism-table -->"
NEIGHBOURS = {Neighbouring.BOUNDED: "\\|q_a − q′_a\\| ≤ Δ_a", Neighbouring.ANY: "any scores"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def privacy_map_text(m: Mechanism) -> str:
    """The map as a formula: ``ε``, ``∞``, or a declared split's stages (at the defaults) and their sum."""
    decl = m.privacy
    if not decl.private:
        return "∞"
    total = "ε" if decl.privacy_map is pure else f"ε ↦ {decl.privacy_map(1.0):g} at ε = 1"
    if decl.split is None:
        return total
    stages = decl.split({k: s.default for k, s in m.params.items()}).stages
    return " + ".join(s.label.replace("epsilon", "ε") for s in stages) + f" = {total}"


def audit_text(decl: Privacy) -> str:
    """How the map is proven: the audit's kind and the parameter settings it runs at."""
    a = decl.audit
    if a.kind is AuditKind.NONE:
        return "none (nothing to prove)"
    settings = " and ".join(", ".join(f"{k} = {v:g}" for k, v in s.items()) or "defaults" for s in a.settings)
    if a.kind is AuditKind.EXACT:
        reach = f"; the loss reaches ≥ {a.reach:.0%} of ε" if a.reach else ""
        return f"exact, at {settings}{reach}"
    return f"statistical, at {settings}; {a.draws:,} draws per input"


def markdown_table(page: Path = PAGE) -> str:
    """One row per registered mechanism; proof links are relative to ``page``."""
    lines = [
        "| name | privacy map | neighbours | audit | proof | exact probabilities | float64 level "
        "| parameters (default, range) | description | slates |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in MECHANISMS.values():
        decl = m.privacy
        params = "<br>".join(f"`{k}` = {s.default:g} in {s.accepted}: {_cell(s.doc)}" for k, s in m.params.items())
        privacy = privacy_map_text(m) if m.private else f"**{privacy_map_text(m)} ({decl.label})**"
        path, _, anchor = decl.proof.partition("#")
        link = posixpath.relpath(path, page.parent.as_posix()) + f"#{anchor}"
        lines.append(
            f"| `{m.name}` | {privacy} | {NEIGHBOURS[decl.neighbouring]} | {_cell(audit_text(decl))} "
            f"| [proof]({link}) | {'yes' if m.exact else 'no'} | {_cell(m.float_level)} | {params or '–'} "
            f"| {_cell(m.description)} "
            f"| {_slate_cell(m)} |"
        )
    return "\n".join(lines) + "\n"


def _slate_cell(m: Mechanism) -> str:
    if m.one_shot:
        return "one pass at ε"
    return "peeling: k steps at ε/k" + (" ([native sampler](privacy-proofs.md#slates))" if m.peel_fn else "")


def with_table(text: str, page: Path = PAGE) -> str:
    """``text`` with the generated table between its markers (each must occur exactly once)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one {BEGIN} line followed by one {END} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{markdown_table(page)}{END}{tail}"


@dataclass(frozen=True)
class TableConfig:
    """``python -m recsvc.mechanisms.docs``: check or rewrite the page's table (one of the two)."""

    check: bool = setting(False, help="exit 1 if the page's table is not the generated one")
    write: bool = setting(False, help="rewrite the page's table in place")
    page: Path = setting(PAGE, help=f"the page (default: {PAGE}, from the repository root)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recsvc.mechanisms.docs", description=__doc__.splitlines()[0])
    add_arguments(parser.add_mutually_exclusive_group(required=True), TableConfig, only=("check", "write"))
    add_arguments(parser, TableConfig, only=("page",))
    cfg: TableConfig = from_namespace(TableConfig, parser.parse_args(argv))
    path = cfg.page
    text = path.read_text(encoding="utf-8")
    new = with_table(text)
    if cfg.check:
        if new != text:
            print(
                f"{path}: the mechanism table is stale; run python -m recsvc.mechanisms.docs --write", file=sys.stderr
            )
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
