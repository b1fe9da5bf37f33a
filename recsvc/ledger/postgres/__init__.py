"""The PostgreSQL store shared by replicas: :class:`PostgresLedger` and its statements in
:mod:`.store`, the schema and its migrations in :mod:`.schema`, the pooled connections in
:mod:`.connection` and the binary array parameters in :mod:`.arrays`. Needs the ``serve`` extra
(psycopg); nothing outside this sub-package imports psycopg at module level."""

from recsvc.ledger.postgres.store import PostgresLedger

__all__ = ["PostgresLedger"]
