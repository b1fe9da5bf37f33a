"""Command-line flags for mechanism parameters, derived from their specs: ``beta`` → ``--beta``,
``corr_budget_fraction`` → ``--corr-budget-fraction`` (default ``None`` = the mechanism's own)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping

from recsvc.mechanisms.registry import PARAM_NAMES, PARAMS, takers
from recsvc.settings import add_setting, flag

__all__ = ["add_param_arguments", "flag", "params_from_namespace"]


def add_param_arguments(
    parser: argparse.ArgumentParser, names: Iterable[str] | None = None, defaults: Mapping[str, str] | None = None
) -> None:
    """Add a flag for each parameter in ``names`` (default: every declared one), from its
    :attr:`~recsvc.mechanisms.params.ParamSpec.setting`. Each defaults to ``None``, so a mechanism
    that takes the parameter uses its own default; ``defaults`` names another default in the help
    where the command supplies one (eval: γ from the data)."""
    for name in PARAM_NAMES if names is None else names:
        spec = PARAMS[name]
        default = (defaults or {}).get(name, f"{spec.default:g}")
        shown = f"{spec.doc}; taken by {', '.join(takers(name))} (default {default}, in {spec.accepted})"
        add_setting(parser, name, dataclasses.replace(spec.setting, help=shown))


def params_from_namespace(args: argparse.Namespace) -> dict[str, float | None]:
    """The parsed parameter flags as ``{name: value or None}``, for ``select(..., **params)``."""
    return {name: getattr(args, name) for name in PARAM_NAMES if hasattr(args, name)}
