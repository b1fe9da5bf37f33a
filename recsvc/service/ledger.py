"""The privacy ledger: per-user ε under basic composition, in embedded SQLite (WAL).

Invariants the service relies on:

* **Atomic check-and-spend across threads and processes.** Every charge runs inside
  ``BEGIN IMMEDIATE``, which takes SQLite's single write lock before the budget is read, so
  two workers can never both see the same remaining budget.
* **Durable before the answer leaves.** ``journal_mode=WAL`` + ``synchronous=FULL`` fsyncs
  the WAL on every COMMIT; the server sends the response only after :meth:`Ledger.charge`
  returns, so a crash can lose an answer the client never saw, never a spend it did see.
* **Idempotent.** The answer is stored with the spend in the same transaction, keyed by
  ``(user_id, request_id)``. A retry with the same fingerprint gets the stored answer and
  spends nothing; a retry with a different fingerprint is a :class:`RequestConflict`.
* **Answers are made inside the transaction.** ``build_response`` (which draws the sample)
  runs only after the replay, conflict and budget checks passed, so a retried or refused
  request never draws a sample.

Tables are ``WITHOUT ROWID`` (the primary key is the row), so a charge writes two B-tree pages
to the WAL instead of four; files created with rowid tables by older versions still work.

The ledger stores no scores: only a SHA-256 fingerprint of the request and the response.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Float sums of ε (e.g. 50 × 0.02) can exceed the budget by a few ulps; allow that much
# (relative 1e-9), no more. The stored total itself is never rounded down.
BUDGET_REL_SLACK = 1e-9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    user_id  TEXT PRIMARY KEY,
    spent    REAL NOT NULL,
    requests INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests (
    user_id     TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    epsilon     REAL NOT NULL,
    response    BLOB NOT NULL,
    created     REAL NOT NULL,
    PRIMARY KEY (user_id, request_id)
) WITHOUT ROWID;
"""


class LedgerError(Exception):
    """Base class of the ledger's refusals (nothing was spent)."""


class BudgetExceeded(LedgerError):
    def __init__(self, user_id: str, epsilon: float, spent: float, budget: float) -> None:
        self.user_id, self.epsilon, self.spent, self.budget = user_id, epsilon, spent, budget
        super().__init__(
            f"privacy budget exhausted for user {user_id!r}: requested epsilon={epsilon:g} but only "
            f"{max(budget - spent, 0.0):g} of {budget:g} remains; nothing was spent"
        )


class RequestConflict(LedgerError):
    def __init__(self, user_id: str, request_id: str) -> None:
        super().__init__(
            f"request_id {request_id!r} was already used for user {user_id!r} with different "
            "parameters; a retry must repeat the request exactly, a new request needs a new request_id"
        )


@dataclass(frozen=True)
class Charge:
    """Outcome of :meth:`Ledger.charge`: the stored response bytes and whether it is a replay."""

    response: bytes
    replayed: bool


@dataclass(frozen=True)
class UserBudget:
    user_id: str
    budget: float
    spent: float
    requests: int

    @property
    def remaining(self) -> float:
        return max(self.budget - self.spent, 0.0)


def _retry_locked(fn: Callable[[], object], attempts: int = 50) -> None:
    """Switching a fresh file to WAL can report 'database is locked' without waiting on the
    busy handler when several processes open it at once; retry briefly."""
    for i in range(attempts):
        try:
            fn()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or i == attempts - 1:
                raise
            time.sleep(0.02 * (i + 1))


class Ledger:
    """Thread-safe (one SQLite connection per thread) and multi-process-safe privacy ledger."""

    def __init__(self, path: str | os.PathLike[str], budget: float, busy_timeout_s: float = 60.0) -> None:
        if not (isinstance(budget, (int, float)) and budget > 0 and budget < float("inf")):
            raise ValueError(f"ledger budget must be a finite number > 0, got {budget!r}")
        self.path = Path(path)
        if self.path.parent and not self.path.parent.is_dir():
            raise FileNotFoundError(f"ledger directory {self.path.parent} does not exist; create it first")
        self.budget = float(budget)
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Writers queue on a thread lock + an flock on a sidecar file, which wake promptly;
        # SQLite's own busy handler would poll with sleeps of up to 100 ms under contention.
        # BEGIN IMMEDIATE remains what guarantees atomicity, even for writers without the flock.
        self._write_lock = threading.Lock()
        self._lock_file = self.path.with_name(self.path.name + ".lock")
        self._lock_fd: tuple[int, int] | None = None  # (pid, fd)
        # Group commit: callers queue under _queued; one of them at a time leads (takes the
        # write lock and commits the whole queue), the others sleep on the condition until
        # their charge is finished, so followers never convoy through the write lock.
        self._queued = threading.Condition(threading.Lock())
        self._queue: list[_Pending] = []
        self._leading = False
        self._writer: tuple[int, sqlite3.Connection] | None = None  # (pid, conn), used under the write lock only
        self.commits = 0  # transactions committed by this process (for tests and metrics)
        # CREATE ... IF NOT EXISTS is idempotent, so concurrent workers may all run it.
        conn = self._conn()
        _retry_locked(lambda: conn.executescript(_SCHEMA))

    # -- connections ---------------------------------------------------------------------

    def _connect(self, shared: bool = False) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves. A connection is never carried
        # across fork; the writer's (shared=True) is used by one thread at a time, under the lock.
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_ms / 1000,
                               check_same_thread=not shared)
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        _retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every COMMIT
        with self._lock:
            self._all.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, for reads."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = self._connect()
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _writer_conn(self) -> sqlite3.Connection:
        """The one connection that writes (call with the write lock held). Whichever thread
        leads a group commit uses it, so its page cache stays warm: a connection's cache is
        dropped whenever ANOTHER connection has written since its last transaction."""
        if self._writer is None or self._writer[0] != os.getpid():
            self._writer = (os.getpid(), self._connect(shared=True))
        return self._writer[1]

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._write_lock:
            if self._lock_fd is None or self._lock_fd[0] != os.getpid():  # an fd is never shared across fork
                self._lock_fd = (os.getpid(), os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o600))
            fd = self._lock_fd[1]
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._write_lock:
            if self._lock_fd is not None and self._lock_fd[0] == os.getpid():
                os.close(self._lock_fd[1])
            self._lock_fd = None
            self._writer = None
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            try:
                c.close()
            except sqlite3.ProgrammingError:  # closed from another thread; harmless at shutdown
                pass
        self._local = threading.local()

    # -- reads (no lock) -----------------------------------------------------------------

    def lookup(self, user_id: str, request_id: str) -> tuple[bytes, bytes] | None:
        """(fingerprint, response) of an earlier request, or None."""
        row = self._conn().execute(
            "SELECT fingerprint, response FROM requests WHERE user_id=? AND request_id=?",
            (user_id, request_id),
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    def user(self, user_id: str) -> UserBudget:
        row = self._conn().execute(
            "SELECT spent, requests FROM budgets WHERE user_id=?", (user_id,)
        ).fetchone()
        spent, n = (0.0, 0) if row is None else (float(row[0]), int(row[1]))
        return UserBudget(user_id, self.budget, spent, n)

    def fits(self, spent: float, epsilon: float) -> bool:
        return spent + epsilon <= self.budget * (1.0 + BUDGET_REL_SLACK)

    def totals(self) -> dict[str, float]:
        """Every user's spent ε (for audits and tests)."""
        return {u: float(s) for u, s in self._conn().execute("SELECT user_id, spent FROM budgets")}

    # -- the one write -------------------------------------------------------------------

    def charge(
        self,
        user_id: str,
        request_id: str,
        fingerprint: bytes,
        epsilon: float,
        build_response: Callable[[float], bytes],
    ) -> Charge:
        """Atomically: replay a stored answer, or check the budget, spend ε and store the answer.

        ``build_response(remaining)`` makes the response bytes given the budget left after
        this spend; it runs inside the transaction, only for a fresh request that fits the
        budget, possibly in another caller's thread (the group-commit leader). If it raises,
        nothing is spent. Raises :class:`BudgetExceeded` or :class:`RequestConflict` with
        nothing spent. Returns only after the COMMIT (fsync).

        Group commit: concurrent callers queue; while one leader commits, the others wait; the
        next leader commits every queued charge in ONE transaction (one fsync), each charge in
        its own savepoint and checked in arrival order, so batching changes throughput, never
        the outcome.
        """
        item = _Pending(user_id, request_id, fingerprint, epsilon, build_response)
        with self._queued:
            self._queue.append(item)
            while self._leading and not item.finished:
                self._queued.wait()
            lead = not item.finished
            self._leading |= lead
        if lead:  # nobody committed it for us: commit everything queued by now
            batch: list[_Pending] | None = None
            try:
                with self._exclusive():
                    with self._queued:
                        batch, self._queue = self._queue, []
                    self._commit_batch(batch)
            finally:
                with self._queued:
                    if batch is None:  # failed before taking the queue: withdraw our charge
                        self._queue.remove(item)
                    self._leading = False
                    self._queued.notify_all()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def _commit_batch(self, batch: list[_Pending]) -> None:
        conn = self._writer_conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            if len(batch) == 1:  # the common case at low load: no savepoint needed
                try:
                    batch[0].result = self._apply(conn, batch[0])
                except LedgerError as exc:  # refused before any write: nothing to undo
                    batch[0].error = exc
            else:
                for i, item in enumerate(batch):
                    conn.execute(f"SAVEPOINT c{i}")
                    try:
                        item.result = self._apply(conn, item)
                        conn.execute(f"RELEASE c{i}")
                    except Exception as exc:  # noqa: BLE001 - this charge alone is refused
                        conn.execute(f"ROLLBACK TO c{i}")
                        conn.execute(f"RELEASE c{i}")
                        item.error = exc
            conn.execute("COMMIT")  # durable (WAL fsync) before anyone sees a response
            self.commits += 1
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for item in batch:  # nothing of this batch was committed
                item.result, item.error = None, exc if isinstance(exc, Exception) else RuntimeError(str(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            for item in batch:
                item.finished = True

    def _apply(self, conn: sqlite3.Connection, p: _Pending) -> Charge:
        row = conn.execute(
            "SELECT fingerprint, response FROM requests WHERE user_id=? AND request_id=?",
            (p.user_id, p.request_id),
        ).fetchone()
        if row is not None:
            if bytes(row[0]) != p.fingerprint:
                raise RequestConflict(p.user_id, p.request_id)
            return Charge(bytes(row[1]), replayed=True)
        b = conn.execute("SELECT spent FROM budgets WHERE user_id=?", (p.user_id,)).fetchone()
        spent = 0.0 if b is None else float(b[0])
        if not self.fits(spent, p.epsilon):
            raise BudgetExceeded(p.user_id, p.epsilon, spent, self.budget)
        new_spent = spent + p.epsilon
        response = p.build_response(max(self.budget - new_spent, 0.0))
        conn.execute(
            "INSERT INTO budgets(user_id, spent, requests) VALUES(?, ?, 1) "
            "ON CONFLICT(user_id) DO UPDATE SET spent=excluded.spent, requests=requests+1",
            (p.user_id, new_spent),
        )
        conn.execute(
            "INSERT INTO requests(user_id, request_id, fingerprint, epsilon, response, created) "
            "VALUES(?, ?, ?, ?, ?, ?)",
            (p.user_id, p.request_id, p.fingerprint, p.epsilon, response, time.time()),
        )
        return Charge(response, replayed=False)


@dataclass(eq=False)
class _Pending:
    """One queued charge; ``finished`` is set by the leader once its batch committed or failed."""

    user_id: str
    request_id: str
    fingerprint: bytes
    epsilon: float
    build_response: Callable[[float], bytes]
    result: Charge | None = None
    error: Exception | None = None
    finished: bool = False
