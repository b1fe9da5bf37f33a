"""The PostgreSQL ledger's connections: libpq timeouts, the per-connection settings, and one cursor
per connection (:class:`recsvc.ledger.postgres.PostgresLedger` pools them)."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper

from recsvc.ledger.postgres import arrays
from recsvc.ledger.waits import Waits


def link_timeouts(timeout_s: float) -> dict[str, Any]:
    """libpq settings that turn a silent network partition into an error within about ``timeout_s``
    (a request then gets UNAVAILABLE) instead of a query that waits for TCP's own retransmission
    limit (many minutes): unacknowledged data, and idle connections probed by keepalives."""
    ms = max(1000, round(timeout_s * 1000))
    return {
        "connect_timeout": max(1, round(timeout_s)),
        "tcp_user_timeout": ms,
        "keepalives": 1,
        "keepalives_idle": max(1, round(timeout_s)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }


def wait_options(waits: Waits) -> str:
    """libpq ``options`` that set the server-side timeouts (:mod:`recsvc.ledger.waits`) when the
    connection starts: no extra round trip, and no ledger statement ever runs without them."""
    return " ".join(f"-c {name}={value}" for name, value in waits.settings().items())


def configure(conn: psycopg.Connection) -> None:
    conn.execute("SET synchronous_commit TO on")  # COMMIT returns only once the WAL is flushed
    conn.execute("SET enable_seqscan TO off")  # every ledger statement is a key lookup (module docstring)
    conn.execute("SET plan_cache_mode TO force_generic_plan")  # index plans, planned once per connection
    # psycopg sends an int as int2, int4 or int8 by its size, and prepares a statement once per
    # parameter types: without this, the sizes of numbers would make several statements of one
    # text, each executed unprepared (parsed and planned) its first times on every connection.
    conn.adapters.register_dumper(int, Int8Dumper)
    conn.adapters.register_dumper(int, Int8BinaryDumper)
    arrays.register(conn)


class Connection(psycopg.Connection[Any]):
    """A pooled ledger connection that runs its statements on one cursor it keeps: a new cursor
    looks up every parameter's dumper again, about 20 µs of client CPU per statement."""

    _cursor: psycopg.Cursor[Any] | None = None

    def run(self, sql: str, args: tuple[Any, ...] | dict[str, Any] = ()) -> psycopg.Cursor[Any]:
        if self._cursor is None or self._cursor.closed:
            self._cursor = self.cursor()
        return self._cursor.execute(sql, args)


def result_sets(cur: psycopg.ClientCursor) -> list[list[tuple[Any, ...]]]:
    """The rows of every statement of a multi-statement query that returns rows, in order."""
    sets = []
    while True:
        if cur.description is not None:
            sets.append(cur.fetchall())
        if not cur.nextset():
            return sets


def roll_back(conn: psycopg.Connection) -> None:
    """Ends a failed transaction on a connection that still works (the pool discards a broken one)."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")
