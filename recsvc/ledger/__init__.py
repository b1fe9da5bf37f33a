"""The privacy-budget ledger: per-user ε under basic composition, exact, idempotent and durable.

One interface, two backing stores, one conformance suite:

* :class:`Ledger` (:mod:`recsvc.ledger.base`) — what the service depends on: a typed budget
  store. It owns the reserve-then-commit protocol (one caller per request at a time, a
  pre-check on a snapshot, the caller's draw holding no lock, a group commit that decides again
  and stores the typed :class:`StoredAnswer`); a store implements only its storage primitives.
* :class:`recsvc.ledger.sqlite.SQLiteLedger` (an embedded file, the default) and
  :class:`recsvc.ledger.postgres.PostgresLedger` (a database shared by replicas);
  :func:`open_ledger` picks one from a ``--ledger`` value.
* :mod:`recsvc.ledger.testing` — the conformance suite every store's tests subclass, and a
  throwaway PostgreSQL cluster.

The rules live once each: charging (:mod:`.charging`), exact units (:mod:`.units`), the pinned
budget and its audited changes (:mod:`.budget`), budget windows (:mod:`.window`), keyed fingerprints (:mod:`.fingerprint`), the audit export (:mod:`.export`) and
what both stores' migrations share (:mod:`.migrations`). Refusals (:mod:`.errors`) carry the
name of their gRPC status in ``status``. The ledger never imports the service or its protobuf
stubs: metrics reach the service through a :class:`LedgerObserver`, and the answers older ledgers
stored as the service's encoded bytes are read by the migrations' own wire reader.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from recsvc.ledger.base import (
    BatchItem,
    BatchReservation,
    Ledger,
    LedgerObserver,
    Reservation,
    is_postgres,
    without_waiting,
)
from recsvc.ledger.budget import BudgetChange, checked_units
from recsvc.ledger.charging import Charge, Drawn, Replay, StoredAnswer, UserBudget
from recsvc.ledger.errors import BudgetExceeded, LedgerError, LedgerUnavailable, RequestConflict, WouldWait
from recsvc.ledger.units import InvalidCharge
from recsvc.ledger.waits import CONNECT_S, DEFAULT_WAITS, Waits
from recsvc.ledger.window import LIFETIME_WINDOW, BudgetWindow

__all__ = [
    "BatchItem",
    "BatchReservation",
    "BudgetChange",
    "BudgetExceeded",
    "BudgetWindow",
    "Charge",
    "Drawn",
    "InvalidCharge",
    "Ledger",
    "LedgerError",
    "LedgerObserver",
    "LedgerUnavailable",
    "Replay",
    "RequestConflict",
    "Reservation",
    "StoredAnswer",
    "UserBudget",
    "Waits",
    "WouldWait",
    "budget_changes",
    "is_postgres",
    "open_ledger",
    "set_budget",
    "without_waiting",
]


def open_ledger(
    ledger: str | Path,
    budget: float,
    key_file: str | Path | None,
    *,
    pool_size: int = 8,
    create: bool = False,
    window: BudgetWindow | str = LIFETIME_WINDOW,
    clock: Callable[[], float] | None = None,
    observer: LedgerObserver | None = None,
    waits: Waits = DEFAULT_WAITS,
    connect_timeout: float = CONNECT_S,
) -> Ledger:
    """The store a ``--ledger`` value names: a PostgreSQL URL, or an SQLite file path (created if
    missing, whatever ``create`` says; a PostgreSQL ledger needs ``create`` or `recsvc ledger init`).
    ``window``: the budget window (``--budget-window``); ``clock``: Unix seconds (tests inject one);
    ``observer``: the metrics callbacks; ``waits``: a PostgreSQL
    ledger's server-side timeouts (:mod:`recsvc.ledger.waits`); ``connect_timeout``: its own
    connection timeout in seconds (:data:`recsvc.ledger.waits.CONNECT_S`)."""
    if is_postgres(ledger):
        from recsvc.ledger.postgres import PostgresLedger

        if key_file is None:
            raise ValueError("a PostgreSQL ledger needs a fingerprint key file")
        return PostgresLedger(
            str(ledger),
            budget,
            key_file,
            pool_size=pool_size,
            create=create,
            window=window,
            clock=clock,
            observer=observer,
            waits=waits,
            timeout_s=connect_timeout,
        )
    from recsvc.ledger.sqlite import SQLiteLedger

    return SQLiteLedger(ledger, budget, key_file=key_file, window=window, clock=clock, observer=observer)


def set_budget(ledger: Path | str, budget: float) -> tuple[str, BudgetChange | None]:
    """`recsvc ledger set-budget`: (where, the recorded change, or None if the budget was already ``budget``)."""
    units = checked_units(budget)
    if is_postgres(ledger):
        from recsvc.ledger.postgres.schema import set_budget_url

        return set_budget_url(str(ledger), units)
    from recsvc.ledger.sqlite.schema import set_budget_file

    return str(ledger), set_budget_file(Path(ledger), units)


def budget_changes(ledger: Path | str) -> list[BudgetChange]:
    """Every recorded budget change of a ledger, oldest first."""
    if is_postgres(ledger):
        from recsvc.ledger.postgres.schema import read_budget_changes_url

        return read_budget_changes_url(str(ledger))
    from recsvc.ledger.sqlite.schema import read_budget_changes_file

    return read_budget_changes_file(Path(ledger))
