"""Opens the ledger store a ``--ledger`` value names (kept apart from :mod:`recsvc.service.ledger_base`,
which both stores import)."""

from __future__ import annotations

from recsvc.service.ledger_base import LedgerStore, is_postgres


def open_store(ledger: object, budget: float, key_file: object, pool_size: int = 8,
               create: bool = False) -> LedgerStore:
    """The store a ``--ledger`` value names: a PostgreSQL URL, or an SQLite file path (created if
    missing, whatever ``create`` says; a PostgreSQL ledger needs ``create`` or `recsvc ledger init`)."""
    if is_postgres(ledger):
        from recsvc.service.ledger_pg import PostgresLedger

        return PostgresLedger(str(ledger), budget, key_file, pool_size=pool_size, create=create)  # type: ignore[arg-type]
    from recsvc.service.ledger import Ledger

    return Ledger(ledger, budget, key_file=key_file)  # type: ignore[arg-type]
