"""The README's mechanism table, generated from the registry.

``python -m recsvc.mechanisms.docs --write README.md`` rewrites the table between the markers;
``--check README.md`` exits 1 when it is stale (a test runs the same check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recsvc.mechanisms.registry import MECHANISMS

BEGIN = "<!-- BEGIN mechanism-table -->"
END = "<!-- END mechanism-table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """One row per registered mechanism: name, privacy, exact, parameters, description."""
    lines = ["| name | privacy | exact probabilities | parameters (default, range) | description |",
             "|---|---|---|---|---|"]
    for m in MECHANISMS.values():
        params = "<br>".join(f"`{k}` = {s.default:g} in {s.accepted}: {_cell(s.doc)}" for k, s in m.params.items())
        privacy = m.privacy.label if m.private else f"**{m.privacy.label}**"
        lines.append(f"| `{m.name}` | {privacy} | {'yes' if m.exact else 'no'} | {params or '–'} | {_cell(m.description)} |")
    return "\n".join(lines) + "\n"


def with_table(text: str) -> str:
    """``text`` with the generated table between its markers (each must occur exactly once)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one {BEGIN} line followed by one {END} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recsvc.mechanisms.docs", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", type=Path, metavar="FILE", help="exit 1 if FILE's table is not the generated one")
    mode.add_argument("--write", type=Path, metavar="FILE", help="rewrite FILE's table in place")
    args = parser.parse_args(argv)
    path: Path = args.check or args.write
    text = path.read_text(encoding="utf-8")
    new = with_table(text)
    if args.check:
        if new != text:
            print(f"{path}: the mechanism table is stale; run python -m recsvc.mechanisms.docs --write {path}",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
