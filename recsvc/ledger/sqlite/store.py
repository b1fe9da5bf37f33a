"""The privacy ledger in embedded SQLite (WAL): :class:`SQLiteLedger`, the default store.

Invariants the service relies on (the protocol itself is :class:`recsvc.ledger.base.Ledger`'s):

* **Exact accounting.** ε is counted in integer units of 10⁻¹² (:mod:`recsvc.ledger.units`):
  every charge rounded up, the budget compared exactly, an ε below the unit refused.
* **Atomic check-and-spend across threads and processes.** Every charge runs inside
  ``BEGIN IMMEDIATE``, which takes SQLite's single write lock before the budget is read, so
  two workers can never both see the same remaining budget.
* **Durable before the answer leaves.** ``journal_mode=WAL`` + ``synchronous=FULL`` fsyncs
  the WAL on every COMMIT; the server sends the response only after a charge returns, so a crash
  can lose an answer the client never saw, never a spend it did see.
* **Idempotent.** The answer is stored with the spend in the same transaction, keyed by
  ``(user_id, request_id)``. A retry with the same fingerprint gets the stored answer and
  spends nothing; a retry with a different fingerprint is a
  :class:`~recsvc.ledger.errors.RequestConflict`.
* **No sampling under the lock.** The sample is drawn before the write transaction, holding no
  lock; the transaction only checks, stores and spends.
* **Budget windows.** The budget holds per user over all time (``lifetime``) or per UTC-aligned
  window (``--budget-window 7d``): only the current window's spend counts, decided inside the
  transaction with one clock reading (:mod:`recsvc.ledger.window`).

The ledger stores no scores: only keyed fingerprints (HMAC-SHA-256 under the server's key,
:mod:`recsvc.ledger.fingerprint`; the key itself is never stored here) and the typed answers.
The file format and its migrations live in :mod:`recsvc.ledger.sqlite.schema`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from recsvc.ledger import fingerprint
from recsvc.ledger.base import NO_WAIT, Accounts, Ledger, LedgerObserver, Stored
from recsvc.ledger.charging import (
    N_STORED,
    REQUEST_COLUMNS,
    STORED_COLUMNS,
    Account,
    Pending,
    PrecheckRow,
    StoredRequest,
    Writes,
    decide_all,
)
from recsvc.ledger.errors import LedgerUnavailable, WouldWait
from recsvc.ledger.group_commit import Queued
from recsvc.ledger.sqlite import files, schema
from recsvc.ledger.sqlite.files import check_path
from recsvc.ledger.sqlite.schema import CHUNK
from recsvc.ledger.window import LIFETIME_WINDOW, BudgetWindow

log = logging.getLogger("recsvc.ledger")


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


class SQLiteLedger(Ledger):
    """Thread-safe (one SQLite connection per thread) and multi-process-safe privacy ledger.

    ``key_file`` holds the fingerprint key (default ``<path>.key``, created with mode 0600 if
    missing). A ledger that already stores requests is never paired with a new key silently:
    if its key file is missing, opening it fails (see :mod:`recsvc.ledger.fingerprint`).
    ``window`` is the budget window (:mod:`recsvc.ledger.window`), fixed in the file when it is
    created; ``clock`` (Unix seconds) places each charge in its window (tests inject one).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        budget: float,
        key_file: str | os.PathLike[str] | None = None,
        busy_timeout_s: float = 60.0,
        window: BudgetWindow | str = LIFETIME_WINDOW,
        clock: Callable[[], float] | None = None,
        observer: LedgerObserver | None = None,
    ) -> None:
        super().__init__(budget, window, clock, observer)
        self.path = Path(path)
        self.where = str(self.path)
        check_path(self.path)
        self.key_file = fingerprint.default_path(self.path) if key_file is None else Path(key_file)
        fingerprint.check(self.key_file)
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
        self._writer: tuple[int, sqlite3.Connection] | None = None  # (pid, conn), used under the write lock only
        self._writer_waits = True  # the writer's busy_timeout: _busy_ms (True) or 0; switched only on a change
        self._full = False  # the last commit failed on the disk (logged once, see _storage_failed)
        try:
            files.check_foreign(self.path)
            files.create_private(self.path)
            files.private_sidecars(self.path)
            self._key, self.key_created = schema.open_file(
                self._conn(), self.path, self.key_file, self.window, self.budget_units, _retry_locked
            )
        except sqlite3.DatabaseError as exc:  # not a database, unwritable, a special file system, ...
            self.close()
            raise files.refused(self.path, files.CANNOT_OPEN, reason=str(exc)) from None
        except BaseException:
            self.close()
            raise

    # -- connections ---------------------------------------------------------------------

    def _connect(self, shared: bool = False) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves. A connection is never carried
        # across fork; the writer's (shared=True) is used by one thread at a time, under the lock.
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=self._busy_ms / 1000, check_same_thread=not shared
        )
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        _retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
        conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every COMMIT
        # Opening gave an EMPTY -wal the file's mode again (SQLite does so while it is empty); narrow it
        # before anything is written there. Once it holds frames SQLite leaves its mode alone.
        files.private_sidecars(self.path, warn=False)
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
            self._writer_waits = True
        return self._writer[1]

    def _writer_waiting(self, wait: bool) -> sqlite3.Connection:
        """The writer's connection with SQLite's busy wait on or off (call with the write lock
        held). The setting stays until the other mode comes: a run of calls in one mode (lone
        calls on the loop, or calls in threads) sets it once, not twice per commit."""
        conn = self._writer_conn()
        if wait != self._writer_waits:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms if wait else 0}")
            self._writer_waits = wait
        return conn

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The write lock: this process's threads, then the flock that other processes take.
        Under :func:`~recsvc.ledger.base.without_waiting` a held one raises WouldWait."""
        wait = not NO_WAIT.get()
        if not self._write_lock.acquire(blocking=wait):
            raise WouldWait(f"the SQLite ledger {self.path}'s write lock is held by another thread")
        try:
            if self._lock_fd is None or self._lock_fd[0] != os.getpid():  # an fd is never shared across fork
                self._lock_fd = (os.getpid(), os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o600))
            fd = self._lock_fd[1]
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WouldWait(f"the SQLite ledger {self.path}'s write lock is held by another process") from None
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._write_lock.release()

    def close(self) -> None:
        with self._write_lock:
            if self._lock_fd is not None and self._lock_fd[0] == os.getpid():
                os.close(self._lock_fd[1])
            self._lock_fd = None
            self._writer = None
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            with contextlib.suppress(sqlite3.ProgrammingError):  # closed from another thread; harmless at shutdown
                c.close()
        self._local = threading.local()

    def reachable(self) -> bool:
        """An embedded file is always there (health checks ask the PostgreSQL store)."""
        return True

    # -- reads (no lock) -----------------------------------------------------------------

    def lookup(self, user_id: str, request_id: str) -> StoredRequest | None:
        row = (
            self._conn()
            .execute(f"SELECT {STORED_COLUMNS} FROM requests WHERE user_id=? AND request_id=?", (user_id, request_id))
            .fetchone()
        )
        return None if row is None else StoredRequest.of(*row)

    def _account(self, user_id: str) -> Account | None:
        return self._accounts(self._conn(), [user_id]).get(user_id)

    def _all_accounts(self) -> Accounts:
        rows = self._conn().execute("SELECT user_id, spent_units, window_start, requests FROM budgets")
        return {u: Account(int(s), int(ws), int(n)) for u, s, ws, n in rows}

    def _precheck_row(self, p: Pending) -> PrecheckRow:
        """One statement on a read snapshot: the writer's connection when no commit holds it (its
        page cache is warm; a reader's is dropped after every commit), else this thread's."""
        if self._write_lock.acquire(blocking=False):
            try:
                if self._writer_waits == (not NO_WAIT.get()):  # its busy wait is this call's
                    return self._read_precheck(self._writer_conn(), p)
            finally:
                self._write_lock.release()
        return self._read_precheck(self._conn(), p)

    @staticmethod
    def _read_precheck(conn: sqlite3.Connection, p: Pending) -> PrecheckRow:
        row = conn.execute(_PRECHECK, (p.user_id, p.request_id)).fetchone()
        stored = None if row[0] is None else StoredRequest.of(*row[:N_STORED])
        s, w, n = row[N_STORED:]
        account = None if s is None else Account(int(s), int(w), int(n))
        return PrecheckRow(stored, account)

    # -- the writes ----------------------------------------------------------------------

    def _commit_group(self, take: Callable[[], list[Queued]]) -> None:
        """The queue is taken once this process holds the write lock, so charges that queued
        meanwhile join the transaction."""
        with self._exclusive():
            self._commit_batch(cast("list[Pending]", take()))  # this store queues charges only

    def _commit_batch(self, batch: list[Pending]) -> None:
        wait = not NO_WAIT.get()
        conn = self._writer_waiting(wait)
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                # without waiting: another process (not a recsvc one: they take the flock) holds SQLite's lock
                if wait or getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                raise WouldWait(f"the SQLite ledger {self.path} is locked by another process") from None
            self._apply(conn, batch)
            conn.execute("COMMIT")  # durable (WAL fsync) before anyone sees a response
            self.commits += 1
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # a full disk may have ended it already
                    conn.execute("ROLLBACK")
            error = self._storage_failed(exc) if isinstance(exc, sqlite3.OperationalError) else None
            for item in batch:  # nothing of this batch was committed
                item.result, item.error = None, error or (exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        if self._full:
            self._full = False
            log.warning("the SQLite ledger %s stores charges again", self.path)

    def _storage_failed(self, exc: sqlite3.OperationalError) -> LedgerUnavailable | None:
        """A commit the disk refused (full, over a file-size limit, failing): UNAVAILABLE, rolled
        back, nothing spent; logged once, without a stack trace, until a commit succeeds again."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary result code
        if code not in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR):
            return None
        if not self._full:
            self._full = True
            log.warning(
                "the SQLite ledger %s cannot store charges (%s: %s); they are refused UNAVAILABLE, nothing spent, "
                "until the disk has room (this is logged once)",
                self.path,
                getattr(exc, "sqlite_errorname", "SQLITE_IOERR"),
                exc,
            )
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_IOERR_FSYNC":  # the COMMIT may have reached the disk
            spent = "it was charged at most once: a retry with the same request_id replays it if it was stored"
        else:
            spent = "nothing was spent, retry with the same request_id later"
        return LedgerUnavailable(
            f"the SQLite ledger {self.path} cannot store the charge: its disk is full or failing ({exc}); {spent}"
        )

    def _apply(self, conn: sqlite3.Connection, batch: list[Pending]) -> None:
        """Decides every charge of the batch in arrival order (:func:`decide_all`), then writes them all.

        The whole batch costs a handful of SQL statements (one read of the budgets, one
        multi-row write each), not ~8 per charge: every statement releases the GIL, and with many
        request threads waiting for it each release costs a thread wake-up while the write lock is held.

        Optimistic: every charge that reached the transaction was new at its pre-check, so the
        batch is first decided as if none of its requests were stored, and the INSERT (which
        probes the unique key anyway) confirms it: if any request turns out to be stored (another
        process committed it since its pre-check), that attempt is rolled back to the savepoint and
        the batch is decided again against the stored requests, exactly as before."""
        now = self._clock()
        keys = [(p.user_id, p.request_id) for p in batch]
        accounts = self._accounts(conn, list({p.user_id: None for p in batch}))
        conn.execute("SAVEPOINT fresh")
        writes = decide_all(batch, {}, accounts, self.window, self.budget_units, now)
        written = {(r.user_id, r.request_id) for r in writes.requests}
        unwritten = [k for k in dict.fromkeys(keys) if k not in written]  # refused: were they stored after all?
        if self._write(conn, writes, now) and not self._stored(conn, unwritten):
            conn.execute("RELEASE fresh")
            return
        conn.execute("ROLLBACK TO fresh")
        conn.execute("RELEASE fresh")
        writes = decide_all(batch, self._stored(conn, keys), accounts, self.window, self.budget_units, now)
        if not self._write(conn, writes, now):
            raise RuntimeError("a request decided as new is already stored")  # cannot happen under the write lock

    @staticmethod
    def _write(conn: sqlite3.Connection, writes: Writes, now: float) -> bool:
        """Stores the users' accounts and the charged requests; False if a request was already
        stored (that row is not written: the caller rolls back)."""
        for i in range(0, len(writes.users), CHUNK):
            part = writes.users[i : i + CHUNK]
            conn.execute(
                "INSERT INTO budgets(user_id, spent_units, window_start, requests) VALUES "
                + ",".join(["(?, ?, ?, ?)"] * len(part))
                + " ON CONFLICT(user_id) DO UPDATE SET spent_units=excluded.spent_units,"
                " requests=excluded.requests, window_start=excluded.window_start",
                [v for row in part for v in row],
            )
        inserted = 0
        for i in range(0, len(writes.requests), CHUNK):
            chunk = writes.requests[i : i + CHUNK]
            inserted += conn.execute(
                f"INSERT INTO requests({REQUEST_COLUMNS}, created) VALUES "
                + ",".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
                + " ON CONFLICT DO NOTHING",
                [v for r in chunk for v in (*r.row(), now)],
            ).rowcount
        return inserted == len(writes.requests)

    def _snapshot(self, keys: list[tuple[str, str]], users: list[str]) -> tuple[Stored, Accounts]:
        conn = self._conn()
        return self._stored(conn, keys), self._accounts(conn, users)

    @staticmethod
    def _stored(conn: sqlite3.Connection, keys: list[tuple[str, str]]) -> Stored:
        """The stored requests among ``keys`` (exact primary-key probes)."""
        out: Stored = {}
        for i in range(0, len(keys), CHUNK):
            part = keys[i : i + CHUNK]
            sql = " UNION ALL ".join(
                [f"SELECT user_id, request_id, {STORED_COLUMNS} FROM requests WHERE user_id=? AND request_id=?"]
                * len(part)
            )
            for u, r, *stored in conn.execute(sql, [v for k in part for v in k]):
                out[(u, r)] = StoredRequest.of(*stored)
        return out

    @staticmethod
    def _accounts(conn: sqlite3.Connection, users: list[str]) -> Accounts:
        """Each user's account row, as stored."""
        out: Accounts = {}
        for i in range(0, len(users), CHUNK):
            part = users[i : i + CHUNK]
            sql = (
                "SELECT user_id, spent_units, window_start, requests FROM budgets WHERE user_id IN "
                f"({','.join(['?'] * len(part))})"
            )
            out.update((u, Account(int(s), int(ws), int(n))) for u, s, ws, n in conn.execute(sql, part))
        return out


# The pre-check's one statement: the request's stored answer and the user's account, NULLs where none.
_PRECHECK = (
    "SELECT " + ", ".join(f"q.{c}" for c in STORED_COLUMNS.split(", ")) + ", b.spent_units, b.window_start, "
    "b.requests FROM (SELECT ?1 AS u, ?2 AS r) AS k LEFT JOIN requests AS q ON q.user_id = k.u AND "
    "q.request_id = k.r LEFT JOIN budgets AS b ON b.user_id = k.u"
)
