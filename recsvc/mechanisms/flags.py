"""Command-line flags for mechanism parameters, derived from their specs: ``beta`` → ``--beta``,
``corr_budget_fraction`` → ``--corr-budget-fraction`` (default ``None`` = the mechanism's own)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping

from recsvc.mechanisms.registry import PARAM_NAMES, PARAMS, takers


def flag(name: str) -> str:
    """The command-line flag of parameter ``name``."""
    return "--" + name.replace("_", "-")


def add_param_arguments(
    parser: argparse.ArgumentParser, names: Iterable[str] | None = None, defaults: Mapping[str, str] | None = None
) -> None:
    """Add a flag for each parameter in ``names`` (default: every declared one). Each defaults
    to ``None``, so a mechanism that takes the parameter uses its own default; ``defaults`` names
    another default in the help where the command supplies one (eval: γ from the data)."""
    for name in PARAM_NAMES if names is None else names:
        spec = PARAMS[name]
        default = (defaults or {}).get(name, f"{spec.default:g}")
        parser.add_argument(
            flag(name),
            type=float,
            default=None,
            metavar=name.upper(),
            help=f"{spec.doc}; taken by {', '.join(takers(name))} (default {default}, in {spec.accepted})".replace(
                "%", "%%"
            ),
        )


def params_from_namespace(args: argparse.Namespace) -> dict[str, float | None]:
    """The parsed parameter flags as ``{name: value or None}``, for ``select(..., **params)``."""
    return {name: getattr(args, name) for name in PARAM_NAMES if hasattr(args, name)}
