"""The PostgreSQL ledger's clock: the database's, not the replica's.

Budget windows (:mod:`recsvc.ledger.window`) are decided by the time a charge commits. Read from
each replica's own clock, a replica whose clock runs a day fast would start a user's next window
a day early. :class:`DatabaseClock` reads the database server's ``clock_timestamp()`` once a
minute and extrapolates between readings with this host's monotonic clock (which no one sets), so
every replica counts in the database's windows without a round trip per charge. A reading that
fails keeps the last one (a database that does not answer charges nothing anyway).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

RESYNC_S = 60.0  # monotonic and database clocks drift apart by well under a millisecond a minute


class DatabaseClock:
    """Unix seconds by the database server's clock; ``connect()`` opens a short-lived connection."""

    def __init__(self, connect: Callable[[], Any], first: Any) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._base = (0.0, 0.0)  # (database seconds, monotonic seconds) of the last reading
        self._sync(first)

    def _sync(self, conn: Any) -> None:
        t0 = time.monotonic()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        t1 = time.monotonic()
        self._base = (float(row[0]), (t0 + t1) / 2)  # the reading sits mid-round-trip

    def __call__(self) -> float:
        db, mono = self._base
        if time.monotonic() - mono > RESYNC_S and self._lock.acquire(blocking=False):
            try:
                with contextlib.suppress(psycopg.Error), self._connect() as conn:
                    self._sync(conn)
            finally:
                self._lock.release()
            db, mono = self._base
        return db + (time.monotonic() - mono)
