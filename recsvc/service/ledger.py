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
to the WAL instead of four. A ledger file with rowid tables works the same: CREATE TABLE IF NOT
EXISTS leaves its tables as they are, and every statement goes by the primary key.

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
from dataclasses import dataclass, field
from pathlib import Path

from recsvc.checks import MissingFileError, ParamError, check_regular_file

# Float sums of ε (e.g. 50 × 0.02) can exceed the budget by a few ulps; allow that much
# (relative 1e-9), no more. The stored total itself is never rounded down.
BUDGET_REL_SLACK = 1e-9
# Rows per multi-row statement: 6 × 64 bound parameters stay far below SQLite's limits.
_CHUNK = 64

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


_SQLITE_MAGIC = b"SQLite format 3\x00"
_EXPECTED = "an SQLite ledger written by `recsvc serve`, or a new file path in an existing, writable directory"


def check_path(path: str | os.PathLike[str]) -> None:
    """Refuses, before anything is created, a ledger path that cannot be an SQLite ledger."""
    p = Path(path)
    if p.exists():
        check_regular_file("{ledger}", p, _EXPECTED)
        try:
            with open(p, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise ParamError("{ledger} {path} cannot be read ({reason}); expected {expected}",
                             path=str(p), reason=exc.strerror, expected=_EXPECTED) from None
        if head and head != _SQLITE_MAGIC:
            raise ParamError("{ledger} {path} is not an SQLite database; expected {expected}", path=str(p), expected=_EXPECTED)
        return
    if not p.parent.is_dir():
        raise MissingFileError("ledger directory {dir} does not exist; create it first ({ledger} {path})",
                               dir=str(p.parent), path=str(p))
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise ParamError("{ledger} {path}: the directory {dir} is not writable; expected {expected}",
                         path=str(p), dir=str(p.parent), expected=_EXPECTED)


def remove_files(path: str | os.PathLike[str]) -> None:
    """Deletes a ledger and its sidecar files (-wal, -shm, .lock). Only for a ledger this process
    just created and never answered from: deleting a used ledger would forget spent budget."""
    p = Path(path)
    for f in (p, *(p.with_name(p.name + suffix) for suffix in ("-wal", "-shm", "-journal", ".lock"))):
        try:
            f.unlink()
        except FileNotFoundError:
            pass


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
        check_path(self.path)
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
        # write lock and commits the whole queue). Every other caller sleeps on its OWN lock
        # until the leader either finished its charge or handed it the lead, so a commit wakes
        # exactly the threads that have something to do (no notify_all storm of threads that
        # only go back to sleep, each costing a GIL hand-off).
        self._queued = threading.Lock()
        self._queue: list[_Pending] = []
        self._leading = False
        self._writer: tuple[int, sqlite3.Connection] | None = None  # (pid, conn), used under the write lock only
        self.commits = 0  # transactions committed by this process (for tests and metrics)
        # CREATE ... IF NOT EXISTS is idempotent, so concurrent workers may all run it.
        try:
            self._check_foreign()
            conn = self._conn()
            _retry_locked(lambda: conn.executescript(_SCHEMA))
        except sqlite3.DatabaseError as exc:  # not a database, unwritable, a special file system, ...
            self.close()
            raise ParamError("{ledger} {path} cannot be opened as an SQLite ledger ({reason}); expected {expected}",
                             path=str(self.path), reason=str(exc), expected=_EXPECTED) from None
        except BaseException:
            self.close()
            raise

    def _check_foreign(self) -> None:
        """Refuses another application's SQLite file, read-only (before WAL mode would modify it)."""
        if not (self.path.is_file() and self.path.stat().st_size > 0):
            return
        ro = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {r[0] for r in ro.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            ro.close()
        if tables and "budgets" not in tables:
            raise ParamError("{ledger} {path} is an SQLite database of something else (tables: {tables}); "
                             "expected {expected}", path=str(self.path), tables=", ".join(sorted(tables)[:5]),
                             expected=_EXPECTED)

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
        next leader commits every queued charge in ONE transaction (one fsync), each charge
        checked in arrival order against the state left by the ones before it, so batching
        changes throughput, never the outcome.
        """
        item = _Pending(user_id, request_id, fingerprint, epsilon, build_response)
        with self._queued:
            self._queue.append(item)
            lead = not self._leading
            self._leading = True
        if not lead:
            item.wake.acquire()  # released by a leader: our charge is finished, or we lead next
            lead = not item.finished
        if lead:  # nobody committed it for us: commit everything queued by now
            batch: list[_Pending] | None = None
            successor: _Pending | None = None
            try:
                with self._exclusive():
                    with self._queued:
                        batch, self._queue = self._queue, []
                    self._commit_batch(batch)
            finally:
                with self._queued:
                    if batch is None:  # failed before taking the queue: withdraw our charge
                        self._queue.remove(item)
                    if self._queue:  # hand the lead to the oldest waiter (it stays "leading")
                        successor = self._queue[0]
                    else:
                        self._leading = False
                if successor is not None:  # first, so its fsync overlaps the wake-ups below
                    successor.wake.release()
                for other in batch or ():
                    if other is not item:
                        other.wake.release()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def _commit_batch(self, batch: list[_Pending]) -> None:
        conn = self._writer_conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._apply(conn, batch)
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

    def _apply(self, conn: sqlite3.Connection, batch: list[_Pending]) -> None:
        """Decides every charge of the batch in arrival order, then writes them all.

        The whole batch costs a handful of SQL statements (one read of the stored requests,
        one of the budgets, one multi-row write each), not ~8 per charge: every statement
        releases the GIL, and with many request threads waiting for it each release costs a
        thread wake-up while the write lock is held. Within the batch the decisions use the
        same rules as one charge at a time (the in-memory state is updated after each)."""
        stored = self._stored(conn, [(p.user_id, p.request_id) for p in batch])
        spent = self._spent(conn, list({p.user_id: None for p in batch}))
        counts: dict[str, int] = {}
        rows: list[tuple[str, str, bytes, float, bytes, float]] = []
        now = time.time()
        for p in batch:
            key = (p.user_id, p.request_id)
            prior = stored.get(key)
            if prior is not None:
                if prior[0] != p.fingerprint:
                    p.error = RequestConflict(p.user_id, p.request_id)
                else:
                    p.result = Charge(prior[1], replayed=True)
                continue
            before = spent.get(p.user_id, 0.0)
            if not self.fits(before, p.epsilon):
                p.error = BudgetExceeded(p.user_id, p.epsilon, before, self.budget)
                continue
            after = before + p.epsilon
            try:
                response = p.build_response(max(self.budget - after, 0.0))
            except Exception as exc:  # noqa: BLE001 - this charge alone is refused, nothing spent
                p.error = exc
                continue
            spent[p.user_id] = after
            counts[p.user_id] = counts.get(p.user_id, 0) + 1
            stored[key] = (p.fingerprint, response)
            rows.append((p.user_id, p.request_id, p.fingerprint, p.epsilon, response, now))
            p.result = Charge(response, replayed=False)
        users = [(u, spent[u], n) for u, n in counts.items()]
        for i in range(0, len(users), _CHUNK):
            part = users[i:i + _CHUNK]
            conn.execute(
                "INSERT INTO budgets(user_id, spent, requests) VALUES " + ",".join(["(?, ?, ?)"] * len(part))
                + " ON CONFLICT(user_id) DO UPDATE SET spent=excluded.spent, requests=requests+excluded.requests",
                [v for row in part for v in row],
            )
        for i in range(0, len(rows), _CHUNK):
            chunk = rows[i:i + _CHUNK]
            conn.execute(
                "INSERT INTO requests(user_id, request_id, fingerprint, epsilon, response, created) VALUES "
                + ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk)),
                [v for row in chunk for v in row],
            )

    @staticmethod
    def _stored(conn: sqlite3.Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[bytes, bytes]]:
        """(fingerprint, response) of the keys already in the ledger (exact primary-key probes)."""
        out: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        for i in range(0, len(keys), _CHUNK):
            part = keys[i:i + _CHUNK]
            sql = " UNION ALL ".join(
                ["SELECT user_id, request_id, fingerprint, response FROM requests WHERE user_id=? AND request_id=?"]
                * len(part))
            for u, r, fp, resp in conn.execute(sql, [v for k in part for v in k]):
                out[(u, r)] = (bytes(fp), bytes(resp))
        return out

    @staticmethod
    def _spent(conn: sqlite3.Connection, users: list[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        for i in range(0, len(users), _CHUNK):
            part = users[i:i + _CHUNK]
            sql = f"SELECT user_id, spent FROM budgets WHERE user_id IN ({','.join(['?'] * len(part))})"
            out.update((u, float(v)) for u, v in conn.execute(sql, part))
        return out


def _locked() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


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
    # Held until a leader releases it (see Ledger.charge); a bare lock is the cheapest wake-up.
    wake: threading.Lock = field(default_factory=_locked)
