"""``recsvc mechanisms``: list the selection mechanisms and their privacy guarantees."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mechanisms",
        help="list the selection mechanisms and their privacy guarantees",
        description="List every selection mechanism: privacy (ε-DP / NOT DP), whether exact "
        "selection probabilities exist, and a one-line description.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def rows() -> list[dict[str, object]]:
    from recsvc.mechanisms import MECHANISMS

    return [
        {"name": m.name, "privacy": m.privacy, "exact": m.exact, "description": m.description}
        for m in MECHANISMS.values()
    ]


def run(args: argparse.Namespace) -> int:
    table = rows()
    if args.json:
        print(json.dumps(table, ensure_ascii=False, indent=2))
        return 0
    w = max(len(str(r["name"])) for r in table)
    print(f"{'name':<{w}}  {'privacy':<7}  {'exact':<5}  description")
    for r in table:
        print(f"{r['name']:<{w}}  {r['privacy']:<7}  {'yes' if r['exact'] else 'no':<5}  {r['description']}")
    return 0
