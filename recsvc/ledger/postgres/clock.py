"""The PostgreSQL ledger's clock: the database's, not the replica's.

Budget windows (:mod:`recsvc.ledger.window`) are decided by the time a charge commits. Read from
each replica's own clock, a replica whose clock runs a day fast would start a user's next window
a day early. :class:`DatabaseClock` reads the database server's ``clock_timestamp()`` once a
minute and extrapolates between readings with this host's monotonic clock (which no one sets), so
every replica counts in the database's windows without a round trip per charge. The reading runs
in a thread of its own, so no charge (which may hold row locks) ever waits for it; one that fails
keeps the last reading and is tried again later (a database that does not answer charges nothing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

RESYNC_S = 60.0  # monotonic and database clocks drift apart by well under a millisecond a minute
RETRY_S = 10.0


class DatabaseClock:
    """Unix seconds by the database server's clock; ``connect()`` opens a short-lived connection."""

    def __init__(self, connect: Callable[[], Any], first: Any) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._base = (0.0, 0.0)  # (database seconds, monotonic seconds) of the last reading
        self._retry_at = 0.0  # monotonic seconds before which a failed reading is not tried again
        self._sync(first)

    def _sync(self, conn: Any) -> None:
        t0 = time.monotonic()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        t1 = time.monotonic()
        self._base = (float(row[0]), (t0 + t1) / 2)  # the reading sits mid-round-trip

    def __call__(self) -> float:
        db, mono = self._base
        now = time.monotonic()
        if now - mono > RESYNC_S and now >= self._retry_at and self._lock.acquire(blocking=False):
            threading.Thread(target=self._resync, name="recsvc-db-clock", daemon=True).start()
        return db + (now - mono)

    def _resync(self) -> None:
        try:
            with self._connect() as conn:
                self._sync(conn)
        except (psycopg.Error, ValueError):  # unreachable (connect's ParamError is a ValueError)
            self._retry_at = time.monotonic() + RETRY_S
        finally:
            self._lock.release()
