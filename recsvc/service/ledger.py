"""The privacy ledger: per-user ε under basic composition, in embedded SQLite (WAL).

Invariants the service relies on:

* **Exact accounting.** ε is counted in integer units of 10⁻¹² (:mod:`recsvc.service.ledger_units`):
  every charge rounded up, the budget compared exactly, an ε below the unit refused.
* **Atomic check-and-spend across threads and processes.** Every charge runs inside
  ``BEGIN IMMEDIATE``, which takes SQLite's single write lock before the budget is read, so
  two workers can never both see the same remaining budget.
* **Durable before the answer leaves.** ``journal_mode=WAL`` + ``synchronous=FULL`` fsyncs
  the WAL on every COMMIT; the server sends the response only after :meth:`Ledger.charge`
  returns, so a crash can lose an answer the client never saw, never a spend it did see.
* **Idempotent.** The answer is stored with the spend in the same transaction, keyed by
  ``(user_id, request_id)``. A retry with the same fingerprint gets the stored answer and
  spends nothing; a retry with a different fingerprint is a :class:`RequestConflict`.
* **No sampling under the lock.** :meth:`Ledger.draw_and_charge` draws the sample before the
  write transaction, holding no lock; the transaction only checks, stores and spends.
* **Budget windows.** The budget holds per user over all time (``lifetime``) or per UTC-aligned
  window (``--budget-window 7d``): only the current window's spend counts, decided inside the
  transaction with one clock reading (:mod:`recsvc.service.ledger_window`).

The ledger stores no scores: only keyed fingerprints (HMAC-SHA-256 under the server's key,
:mod:`recsvc.service.fingerprint_key`; the key itself is never stored here) and the responses.
The file format and its migration live in :mod:`recsvc.service.ledger_schema`.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from recsvc.checks import ParamError
from recsvc.service import fingerprint_key, ledger_schema
from recsvc.service.ledger_base import (BudgetExceeded, Charge, Flights, LedgerError, LedgerUnavailable, Pending,
                                        RequestConflict, UserBudget, GroupCommit, Writes, account, decide_all,
                                        draw_then_commit, precheck, unset)
from recsvc.service.ledger_schema import CHUNK, EXPECTED, check_path, remove_files
from recsvc.service.ledger_units import MAX_EPSILON, InvalidCharge, budget_units, charge_units, to_epsilon
from recsvc.service.ledger_window import LIFETIME_WINDOW, BudgetWindow

__all__ = ["BudgetExceeded", "Charge", "InvalidCharge", "Ledger", "LedgerError", "LedgerUnavailable", "RequestConflict",
           "UserBudget", "check_path", "remove_files"]

S = TypeVar("S")


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
    """Thread-safe (one SQLite connection per thread) and multi-process-safe privacy ledger.

    ``key_file`` holds the fingerprint key (default ``<path>.key``, created with mode 0600 if
    missing). A ledger that already stores requests is never paired with a new key silently:
    if its key file is missing, opening it fails (see :mod:`recsvc.service.fingerprint_key`).
    ``window`` is the budget window (:mod:`recsvc.service.ledger_window`), fixed in the file when
    it is created; ``clock`` (Unix seconds) places each charge in its window (tests inject one).
    """

    def __init__(self, path: str | os.PathLike[str], budget: float, key_file: str | os.PathLike[str] | None = None,
                 busy_timeout_s: float = 60.0, window: BudgetWindow | str = LIFETIME_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        units = budget_units(budget) if isinstance(budget, (int, float)) and budget > 0 else None
        if units is None:
            raise ValueError(f"ledger budget must be a finite number > 0, from 1e-12 to {MAX_EPSILON}, got {budget!r}")
        self.path = Path(path)
        check_path(self.path)
        self.key_file = fingerprint_key.default_path(self.path) if key_file is None else Path(key_file)
        fingerprint_key.check(self.key_file)
        self.budget_units = units
        self.budget = to_epsilon(units)
        self.window = BudgetWindow.parse(window)
        self._clock = clock
        self._key = b""
        self.key_created = False  # this open created the key file
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
        self._commit_all = GroupCommit(self._transaction)  # one transaction for all queued charges
        self._writer: tuple[int, sqlite3.Connection] | None = None  # (pid, conn), used under the write lock only
        self._flights = Flights()  # one draw_and_charge per (user_id, request_id) at a time
        self.commits = 0  # transactions committed by this process (for tests and metrics)
        try:
            ledger_schema.check_foreign(self.path)
            self._open()
        except sqlite3.DatabaseError as exc:  # not a database, unwritable, a special file system, ...
            self.close()
            raise ParamError("{ledger} {path} cannot be opened as an SQLite ledger ({reason}); expected {expected}",
                             path=str(self.path), reason=str(exc), expected=EXPECTED) from None
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        """Creates, checks or migrates the file and loads or creates the key (ledger_schema.open_file)."""
        self._key, self.key_created = ledger_schema.open_file(self._conn(), self.path, self.key_file, self.window,
                                                              _retry_locked)

    def fingerprint(self, digest: bytes) -> bytes:
        """What the ledger stores for a request whose SHA-256 digest is ``digest``: HMAC(key, digest)."""
        return fingerprint_key.keyed(self._key, digest)

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

    def reachable(self) -> bool:
        """An embedded file is always there (health checks ask the PostgreSQL store)."""
        return True

    # -- reads (no lock) -----------------------------------------------------------------

    def lookup(self, user_id: str, request_id: str) -> tuple[bytes, bytes] | None:
        """(stored fingerprint, response) of an earlier request, or None."""
        row = self._conn().execute(
            "SELECT fingerprint, response FROM requests WHERE user_id=? AND request_id=?",
            (user_id, request_id),
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    def user(self, user_id: str) -> UserBudget:
        """The user's account in the current budget window."""
        return account(user_id, self.budget_units, self.window, self._accounts(self._conn(), [user_id]).get(user_id),
                       self._clock())

    def totals(self) -> dict[str, float]:
        """Every user's ε spent in the current window (for audits and tests; exact values: :meth:`user`)."""
        rows = self._conn().execute("SELECT user_id, spent_units, window_start FROM budgets")
        return {u: to_epsilon(s) for u, s in self.window.spent_now(rows, self._clock()).items()}

    def _precheck(self, p: Pending) -> Charge | None:
        """:func:`precheck` on a read snapshot, holding no lock (one statement)."""
        row = self._conn().execute(
            "SELECT (SELECT fingerprint FROM requests WHERE user_id=?1 AND request_id=?2),"
            " (SELECT response FROM requests WHERE user_id=?1 AND request_id=?2),"
            " (SELECT spent_units FROM budgets WHERE user_id=?1),"
            " (SELECT window_start FROM budgets WHERE user_id=?1)", (p.user_id, p.request_id)).fetchone()
        return precheck(p, row, self.window, self.budget_units, self._clock())

    # -- the writes ----------------------------------------------------------------------

    def draw_and_charge(self, user_id: str, request_id: str, digest: bytes, epsilon: float,
                        draw: Callable[[], S], build_response: Callable[[S, float], bytes], *,
                        mechanism: str = "") -> Charge:
        """The service's protocol: draw the sample OUTSIDE the write transaction, then charge it.

        1. ``epsilon`` becomes units, or :class:`InvalidCharge` before the ledger is touched.
        2. Callers of the same (user_id, request_id) in this process take turns, so concurrent
           duplicates draw once: the later ones find the stored answer in step 3.
        3. Pre-check on a read snapshot, holding no lock: a stored answer is replayed, another
           fingerprint is a conflict, an exhausted budget is refused. None of these draws.
        4. ``draw()`` runs in the caller's thread holding no lock, so its cost (random stopping
           makes about 1/γ draws) delays no other request's charge.
        5. :meth:`charge` decides again inside the transaction (same rule) and stores
           ``build_response(sample, remaining)`` with the spend; ``build_response`` runs under
           the lock, so it must be cheap (encoding only).

        If step 5 finds that the request became a replay (another worker committed the same
        request first), a conflict, or over budget (the user's other requests spent it in the
        meantime), the drawn sample is discarded unreleased. A sample that is never released
        reveals nothing about the data, so discarding it costs no privacy: each released answer
        is charged exactly once, and a retry gets the stored answer, never a fresh sample.
        """
        p = Pending(user_id, request_id, self.fingerprint(digest), charge_units(epsilon), unset, mechanism)
        return draw_then_commit(self, p, draw, build_response)

    def charge(self, user_id: str, request_id: str, digest: bytes, epsilon: float,
               build_response: Callable[[float], bytes], *, mechanism: str = "") -> Charge:
        """Atomically: replay a stored answer, or check the budget, spend ε and store the answer.

        ``digest`` is the request's SHA-256 digest (the ledger stores only its keyed
        fingerprint). ``build_response(remaining)`` makes the response bytes given the budget
        left after this spend; it runs inside the transaction, only for a fresh request that
        fits the budget, possibly in another caller's thread (the group-commit leader). If it
        raises, nothing is spent. Raises :class:`InvalidCharge` (before anything is touched),
        :class:`BudgetExceeded` or :class:`RequestConflict` with nothing spent. Returns only
        after the COMMIT (fsync). ``mechanism`` is stored with the charge (``recsvc ledger export``).
        """
        return self._commit(Pending(user_id, request_id, self.fingerprint(digest), charge_units(epsilon), build_response,
                                    mechanism))

    def _commit(self, item: Pending) -> Charge:
        return self._commit_all.one(item)

    def _transaction(self, take: Callable[[], list[Pending]]) -> None:
        """The group-commit leader's transaction (:class:`GroupCommit`): the queue is taken once
        this process holds the write lock, so charges that queued meanwhile join it."""
        with self._exclusive():
            self._commit_batch(take())

    def _commit_batch(self, batch: list[Pending]) -> None:
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
        written = {(r[0], r[1]) for r in writes.requests}
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
            part = writes.users[i:i + CHUNK]
            conn.execute(
                "INSERT INTO budgets(user_id, spent_units, requests, window_start) VALUES "
                + ",".join(["(?, ?, ?, ?)"] * len(part))
                + " ON CONFLICT(user_id) DO UPDATE SET spent_units=excluded.spent_units,"
                " requests=excluded.requests, window_start=excluded.window_start",
                [v for row in part for v in row],
            )
        inserted = 0
        for i in range(0, len(writes.requests), CHUNK):
            chunk = writes.requests[i:i + CHUNK]
            inserted += conn.execute(
                "INSERT INTO requests(user_id, request_id, fingerprint, epsilon_units, response, mechanism, created) "
                "VALUES " + ",".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(chunk)) + " ON CONFLICT DO NOTHING",
                [v for row in chunk for v in (*row, now)],
            ).rowcount
        return inserted == len(writes.requests)

    def _snapshot(self, keys: list[tuple[str, str]], users: list[str]) -> tuple[
            dict[tuple[str, str], tuple[bytes, bytes]], dict[str, tuple[int, int, int]]]:
        """The batch pre-check's read (:mod:`recsvc.service.ledger_batch`), holding no lock: the
        stored (fingerprint, response) of ``keys`` and each user's stored account."""
        conn = self._conn()
        return self._stored(conn, keys), self._accounts(conn, users)

    @staticmethod
    def _stored(conn: sqlite3.Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[bytes, bytes]]:
        """(fingerprint, response) of the keys already in the ledger (exact primary-key probes)."""
        out: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        for i in range(0, len(keys), CHUNK):
            part = keys[i:i + CHUNK]
            sql = " UNION ALL ".join(
                ["SELECT user_id, request_id, fingerprint, response FROM requests WHERE user_id=? AND request_id=?"]
                * len(part))
            for u, r, fp, resp in conn.execute(sql, [v for k in part for v in k]):
                out[(u, r)] = (bytes(fp), bytes(resp))
        return out

    @staticmethod
    def _accounts(conn: sqlite3.Connection, users: list[str]) -> dict[str, tuple[int, int, int]]:
        """(spent_units, window_start, requests) of each user's row, as stored."""
        out: dict[str, tuple[int, int, int]] = {}
        for i in range(0, len(users), CHUNK):
            part = users[i:i + CHUNK]
            sql = ("SELECT user_id, spent_units, window_start, requests FROM budgets WHERE user_id IN "
                   f"({','.join(['?'] * len(part))})")
            out.update((u, (int(s), int(ws), int(n))) for u, s, ws, n in conn.execute(sql, part))
        return out

