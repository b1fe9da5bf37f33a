"""Opens the ledger store a ``--ledger`` value names (kept apart from :mod:`recsvc.service.ledger_base`,
which both stores import)."""

from __future__ import annotations

import time
from collections.abc import Callable

from recsvc.service.ledger_base import LedgerStore, is_postgres
from recsvc.service.ledger_window import LIFETIME_WINDOW, BudgetWindow


def open_store(ledger: object, budget: float, key_file: object, pool_size: int = 8, create: bool = False,
               window: BudgetWindow | str = LIFETIME_WINDOW, clock: Callable[[], float] = time.time) -> LedgerStore:
    """The store a ``--ledger`` value names: a PostgreSQL URL, or an SQLite file path (created if
    missing, whatever ``create`` says; a PostgreSQL ledger needs ``create`` or `recsvc ledger init`).
    ``window``: the budget window (``--budget-window``); ``clock``: Unix seconds (tests inject one)."""
    if is_postgres(ledger):
        from recsvc.service.ledger_pg import PostgresLedger

        return PostgresLedger(str(ledger), budget, key_file, pool_size=pool_size, create=create,  # type: ignore[arg-type]
                              window=window, clock=clock)
    from recsvc.service.ledger import Ledger

    return Ledger(ledger, budget, key_file=key_file, window=window, clock=clock)  # type: ignore[arg-type]
