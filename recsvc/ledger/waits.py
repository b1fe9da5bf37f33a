"""How long a PostgreSQL ledger connection may wait before it gives up: the server-side timeouts
every pooled connection sets (``--ledger-lock-timeout``, ``--ledger-statement-timeout``,
``--ledger-idle-timeout``; the defaults live here once), and the replica's own connection timeout
(:data:`CONNECT_S`, ``--ledger-connect-timeout``).

* ``lock_timeout``: a charge that waits this long for a row or table lock (a psql session holding
  ``FOR UPDATE`` on a user's budget row, a replica frozen inside its locking transaction) is
  refused UNAVAILABLE, its transaction rolled back, nothing spent.
* ``statement_timeout``: no ledger statement runs longer, whatever it waits on.
* ``idle_in_transaction_session_timeout``: the server ends a session that sits inside a
  transaction this long (a replica SIGSTOPped between ``FOR UPDATE`` and ``COMMIT``), which
  releases its row locks for every other replica. The frozen replica's transaction is rolled back,
  so nothing it had not committed is spent.

A round of group commit (:class:`recsvc.ledger.group_commit.GroupCommit`) holds every charge
queued in this process, all users', so it never waits on a row for long: its statements wait at
most :data:`ROUND_LOCK_S` (the pooled connections' own ``lock_timeout``), then the round skips the
row (``FOR UPDATE SKIP LOCKED``) and sets its user's charges aside, and each of their callers waits
for the row in its own transaction, at most ``lock_timeout``. So another session holding one
user's row stalls only that user's charges; the others lose at most ``ROUND_LOCK_S`` per round.

Stdlib only: the service's configuration reads the defaults without loading psycopg.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Waits:
    """The three timeouts, in seconds (each > 0)."""

    lock_s: float = 2.0
    statement_s: float = 10.0
    idle_in_transaction_s: float = 30.0

    def __post_init__(self) -> None:
        for name, value in (
            ("lock timeout", self.lock_s),
            ("statement timeout", self.statement_s),
            ("idle-in-transaction timeout", self.idle_in_transaction_s),
        ):
            if not 0 < value < 86_400:
                raise ValueError(f"the ledger's {name} must be in (0, 86400) seconds, got {value!r}")

    @property
    def lock_ms(self) -> int:
        return max(1, round(self.lock_s * 1000))

    def settings(self) -> dict[str, str]:
        """A pooled connection's PostgreSQL settings (milliseconds, at least 1); its lock_timeout is
        a round's (:data:`ROUND_LOCK_S`, or ``lock_s`` if shorter)."""
        return {
            "lock_timeout": f"{min(self.lock_ms, max(1, round(ROUND_LOCK_S * 1000)))}ms",
            "statement_timeout": f"{max(1, round(self.statement_s * 1000))}ms",
            "idle_in_transaction_session_timeout": f"{max(1, round(self.idle_in_transaction_s * 1000))}ms",
        }


DEFAULT_WAITS = Waits()

# The replica's own side (``--ledger-connect-timeout``): how long a request waits for a pooled
# connection, how long libpq waits to connect or for an answer over a silent link (connect_timeout,
# tcp_user_timeout, keepalives: a partition becomes an error), and how long the pool retries a lost
# connection before it gives the slot up (the next request then tries at once). Seconds.
CONNECT_S = 5.0

# Seconds a round's statement waits for a lock before the round falls back (see above): far more
# than another replica's transaction holds a row (about a millisecond), far less than a stall.
ROUND_LOCK_S = 0.05
