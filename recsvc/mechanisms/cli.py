"""``recsvc mechanisms``: list the selection mechanisms, their privacy guarantees and parameters."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

from recsvc.settings import add_arguments, from_namespace, setting


@dataclass(frozen=True)
class ListingConfig:
    """How ``recsvc mechanisms`` prints the list."""

    json: bool = setting(False, help="print JSON instead of a table")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mechanisms",
        help="list the selection mechanisms and their privacy guarantees",
        description="List every selection mechanism: privacy (ε-DP / NOT DP), whether exact "
        "selection probabilities exist, its parameters (name=default in range) and a one-line description.",
    )
    add_arguments(p, ListingConfig)
    p.set_defaults(func=run)


def rows() -> list[dict[str, object]]:
    from recsvc.mechanisms import MECHANISMS

    return [
        {
            "name": m.name,
            "privacy": m.privacy.label,
            "exact": m.exact,
            "params": {k: {**dataclasses.asdict(s), "accepted": s.accepted} for k, s in m.params.items()},
            "description": m.description,
        }
        for m in MECHANISMS.values()
    ]


def run(args: argparse.Namespace) -> int:
    from recsvc.mechanisms import MECHANISMS

    if from_namespace(ListingConfig, args).json:
        print(json.dumps(rows(), ensure_ascii=False, indent=2))
        return 0
    params = {n: ", ".join(s.summary for s in m.params.values()) or "-" for n, m in MECHANISMS.items()}
    w = max(len(n) for n in MECHANISMS)
    pw = max(len(p) for p in params.values())
    print(f"{'name':<{w}}  {'privacy':<7}  {'exact':<5}  {'parameters':<{pw}}  description")
    for n, m in MECHANISMS.items():
        print(f"{n:<{w}}  {m.privacy.label:<7}  {'yes' if m.exact else 'no':<5}  {params[n]:<{pw}}  {m.description}")
    return 0
