"""The per-user budget a ledger is pinned to, and the audited command that changes it.

A ledger stores its budget (exact units, :mod:`recsvc.ledger.units`) when it is created (SQLite:
the first open or `recsvc ledger init`; PostgreSQL: `recsvc ledger init`). Every later open must
name the same budget or is refused (:func:`mismatch`): two processes on one ledger with different
budgets would let a user refused by one spend the difference through the other, and a restart
with a larger budget would raise every user's budget silently.

The budget changes only through `recsvc ledger set-budget` (:func:`recsvc.ledger.set_budget`), which
records each change (when, the old and new budget, the OS or database user who made it) in the
ledger; `recsvc ledger export` writes that history into the export's metadata
(:func:`recsvc.ledger.budget_changes`). Processes
already running keep the budget they were started with until they restart with the new one (a
restart with the old one is then refused).
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from recsvc.checks import ParamError
from recsvc.ledger.units import MAX_EPSILON, budget_units, format_units

SET_BUDGET = "`recsvc ledger set-budget --ledger LEDGER --budget B`"


@dataclass(frozen=True)
class BudgetChange:
    """One audited change: ``time`` (Unix seconds), the budget before and after (units), and who."""

    time: float
    old_units: int
    new_units: int
    changed_by: str

    def as_dict(self) -> dict[str, object]:
        return {
            "time": self.time,
            "old_budget": format_units(self.old_units),
            "new_budget": format_units(self.new_units),
            "changed_by": self.changed_by,
        }


def checked_units(budget: float) -> int:
    """``budget`` in units, or a ParamError naming ``{budget}``."""
    units = budget_units(budget) if isinstance(budget, (int, float)) and budget > 0 else None
    if units is None:
        raise ParamError(
            "{budget} must be a finite number > 0, from 1e-12 to {most}, got {got}", most=MAX_EPSILON, got=repr(budget)
        )
    return units


def mismatch(got_units: int, stored_units: int, where: str) -> ParamError:
    """The refusal of a process whose budget is not the one the ledger is pinned to."""
    return ParamError(
        "{budget} {got} differs from the budget ε={stored} that the ledger {where} is pinned to; every "
        "process on one ledger must use the same budget (expected {budget} {stored}; to change the "
        "budget, run " + SET_BUDGET + ", which records the change)",
        got=format_units(got_units),
        stored=format_units(stored_units),
        where=where,
    )


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no $USER
        return "unknown"
