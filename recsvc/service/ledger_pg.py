"""The privacy ledger in PostgreSQL, shared by several `recsvc serve` replicas.

Same protocol and invariants as the SQLite store (:class:`recsvc.service.ledger.Ledger`):

* **Atomic check-and-spend across replicas.** A charge is stored by a transaction that holds
  the user's budget row lock. First optimistically (:meth:`PostgresLedger._charge_unchanged`):
  the charge is decided on the account its pre-check read, and ONE autocommit statement locks
  that row only if the account is still exactly that, moves it on and stores the answer. An
  account only moves forward, so an unchanged one means no charge of the user committed since
  the read. Otherwise the locking transaction (:meth:`PostgresLedger._transaction`): READ
  COMMITTED, ``SELECT … FOR UPDATE`` on the user's row, then re-read the stored request and the
  spend, decide, store, COMMIT; every other charge of that user, from any replica, waits.
* **Group commit.** The charges and the pre-checks that queue in this process while its previous
  round runs share the next round's one statement
  (:class:`recsvc.service.ledger_base.GroupCommit`): it stores the charges and reads the
  pre-checks on its snapshot, so a Select costs about half a statement under load; a SelectBatch
  is one commit; rows are locked in user_id order, so no lock cycle forms.
* **Index lookups only.** Every pooled connection runs with ``enable_seqscan`` off and generic
  plans: the prepared statements' arrays hide their sizes from the planner, and a plan cached
  while the tables were small must not scan every user's row once they are large.
* **Durable before the answer leaves.** ``synchronous_commit = on`` for every pooled connection;
  the answer is stored with its spend and returned only after COMMIT returned. PostgreSQL groups
  the WAL flushes of concurrent commits itself, so charges of different users share fsyncs.
* **Idempotent**, **exact units**, **keyed fingerprints**, **no sampling under the lock**: as in
  the SQLite store (:mod:`recsvc.service.ledger_base` holds the shared rule).
* **One item's values fail only that item.** A round statement that fails on an item's values
  (a data or integrity error; validation refuses the one known case, a NUL in an id) stored
  nothing, and its items are done again one at a time (:meth:`PostgresLedger._round`).
* **Outages.** A lost connection or an exhausted pool is :class:`LedgerUnavailable` (gRPC
  UNAVAILABLE). A charge whose connection failed is retried once on a fresh connection: the retry
  re-checks the stored request, so a COMMIT that did go through is found, never charged twice.

Connections come from a ``psycopg_pool.ConnectionPool`` of ``pool_size`` connections per
process. Errors name the host, port and database, never the password.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.types.numeric import Int8BinaryDumper, Int8Dumper
from psycopg_pool import ConnectionPool, PoolTimeout

from recsvc.checks import ParamError
from recsvc.service import fingerprint_key, ledger_pg_schema, ledger_pg_sql as sql, metrics, pg_arrays
from recsvc.service.ledger_base import (Charge, Flights, GroupCommit, LedgerError, LedgerUnavailable, Pending, Queued,
                                        UserBudget, account, decide_all, draw_then_commit, precheck, unset)
from recsvc.service.ledger_pg_schema import connect, describe, scrub
from recsvc.service.ledger_units import MAX_EPSILON, budget_units, charge_units, to_epsilon
from recsvc.service.ledger_window import LIFETIME_WINDOW, BudgetWindow
from recsvc.service.pg_arrays import BinaryArray

S = TypeVar("S")
T = TypeVar("T")
_DOWN = (psycopg.OperationalError, PoolTimeout)


def _link_timeouts(timeout_s: float) -> dict[str, int]:
    """libpq settings that turn a silent network partition into an error within about ``timeout_s``
    (a request then gets UNAVAILABLE) instead of a query that waits for TCP's own retransmission
    limit (many minutes): unacknowledged data, and idle connections probed by keepalives."""
    ms = max(1000, round(timeout_s * 1000))
    return {"connect_timeout": max(1, round(timeout_s)), "tcp_user_timeout": ms, "keepalives": 1,
            "keepalives_idle": max(1, round(timeout_s)), "keepalives_interval": 1, "keepalives_count": 3}


def _configure(conn: psycopg.Connection) -> None:
    conn.execute("SET synchronous_commit TO on")  # COMMIT returns only once the WAL is flushed
    conn.execute("SET enable_seqscan TO off")  # every ledger statement is a key lookup (module docstring)
    conn.execute("SET plan_cache_mode TO force_generic_plan")  # index plans, planned once per connection
    # psycopg sends an int as int2, int4 or int8 by its size, and prepares a statement once per
    # parameter types: without this, the arrays' sizes of numbers made several statements of one
    # text, each executed unprepared (parsed and planned) its first times on every connection.
    conn.adapters.register_dumper(int, Int8Dumper)
    conn.adapters.register_dumper(int, Int8BinaryDumper)
    pg_arrays.register(conn)


class _Connection(psycopg.Connection[Any]):
    """A pooled ledger connection that runs its statements on one cursor it keeps: a new cursor
    looks up every parameter's dumper again, about 20 µs of client CPU per statement."""

    _cursor: psycopg.Cursor[Any] | None = None

    def run(self, sql: str, args: tuple[Any, ...] | dict[str, Any] = ()) -> psycopg.Cursor[Any]:
        if self._cursor is None or self._cursor.closed:
            self._cursor = self.cursor()
        return self._cursor.execute(sql, args)


class PostgresLedger:
    """A :class:`recsvc.service.ledger_base.LedgerStore` in PostgreSQL (thread-safe, multi-replica).

    ``create=True`` (``recsvc ledger init``) creates the schema and the key file if missing and
    stores the settings; otherwise the database must hold a ledger with this budget, budget
    window and key. ``clock`` (Unix seconds) places each charge in its window (tests inject one).
    """

    def __init__(self, url: str, budget: float, key_file: str | os.PathLike[str], pool_size: int = 8,
                 timeout_s: float = 5.0, create: bool = False, window: BudgetWindow | str = LIFETIME_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        units = budget_units(budget) if isinstance(budget, (int, float)) and budget > 0 else None
        if units is None:
            raise ValueError(f"ledger budget must be a finite number > 0, from 1e-12 to {MAX_EPSILON}, got {budget!r}")
        if pool_size < 1:
            raise ParamError("{ledger_pool} must be >= 1, got {got}", got=pool_size)
        self.where = describe(url)
        self.url = url
        self.budget_units, self.budget = units, to_epsilon(units)
        self.window = BudgetWindow.parse(window)
        self._clock = clock
        self.key_file = Path(key_file)
        self.key_created = False
        self.commits = 0
        self.moved = 0  # charges whose account moved after their pre-check: decided under the lock
        self._flights = Flights()
        # The charges and pre-checks that queue in this process while its previous round runs: one
        # statement (:meth:`_group`).
        self._commit_all = GroupCommit(self._group)
        self._probe: psycopg.Connection | None = None  # reachable()'s own connection
        self._probe_lock = threading.Lock()
        if create:
            fingerprint_key.check(self.key_file)
            self._key, self.key_created = fingerprint_key.load_or_create(self.key_file)
        else:
            self._key = fingerprint_key.load(self.key_file)
        connect_timeout = max(1, round(timeout_s))
        try:
            with connect(url, self.where, connect_timeout) as conn:
                if create:
                    ledger_pg_schema.init(conn, self.where, units, self._key, self.window)
                else:
                    ledger_pg_schema.check(conn, self.where, units, self._key, self.window)
        except BaseException:
            if self.key_created:
                self.key_file.unlink(missing_ok=True)
            raise
        # reconnect_timeout: a slot that failed to reconnect for timeout_s is given up, and the next
        # request grows the pool again with an immediate attempt, so service resumes as soon as the
        # server is back instead of after a long exponential backoff.
        self._pool = ConnectionPool(url, min_size=pool_size, max_size=pool_size, timeout=timeout_s, open=False,
                                    reconnect_timeout=timeout_s,
                                    # prepared on their first execution, not after psycopg's default 5, each
                                    # planned until then: every statement here repeats on every connection.
                                    kwargs={"autocommit": True, "prepare_threshold": 0, **_link_timeouts(timeout_s)},
                                    connection_class=_Connection, configure=_configure, name="recsvc-ledger")
        self._pool.open(wait=True, timeout=timeout_s * 2)

    def _unavailable(self, exc: BaseException) -> LedgerUnavailable:
        reason = scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, self.url)
        return LedgerUnavailable(f"the PostgreSQL ledger at {self.where} is unavailable ({reason}); nothing was "
                                 "charged unless the answer was stored, so retry with the same request_id")

    def fingerprint(self, digest: bytes) -> bytes:
        return fingerprint_key.keyed(self._key, digest)

    def close(self) -> None:
        self._pool.close()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()
            self._probe = None

    def reachable(self) -> bool:
        """Whether the database answers now (for health checks): a probe connection of its own, so
        a probe never waits behind requests for a pooled one, kept open between probes (a probe
        every second would otherwise cost the server a new backend every second), and replaced at
        once when it died with a restarted server."""
        with self._probe_lock:
            while True:
                reused, t0 = self._probe is not None and not self._probe.closed, time.monotonic()
                try:
                    if not reused:
                        self._probe = psycopg.connect(self.url, autocommit=True, application_name="recsvc-probe",
                                                      **_link_timeouts(2.0))
                    self._probe.execute("SELECT 1")  # type: ignore[union-attr]
                    return True
                except psycopg.Error:
                    if self._probe is not None:
                        self._probe.close()
                    self._probe = None
                    if not reused or time.monotonic() - t0 > 1.0:  # down or cut off, not just a stale socket
                        return False

    # -- reads ---------------------------------------------------------------------------

    def _retrying(self, fn: Callable[[_Connection], T]) -> T:
        """``fn`` on a pooled connection; after a connection failure (the server restarted, the
        pool still holds dead connections) once more on a checked one, then UNAVAILABLE. Safe for
        charges too: the retry decides again on what is stored."""
        for attempt in range(2):
            try:
                with self._pool.connection() as conn:
                    return fn(conn)  # type: ignore[arg-type]
            except psycopg.errors.DeadlockDetected:  # an OperationalError, but the server is up
                raise
            except _DOWN as exc:
                # Unreachable now (down, or a partition): fail fast rather than also wait on the
                # pool's other, equally dead connections.
                if attempt == 1 or isinstance(exc, PoolTimeout) or not self.reachable():
                    raise self._unavailable(exc) from None
                self._pool.check()  # drop the connections that died with the server
        raise AssertionError("unreachable")

    def _read(self, sql: str, args: tuple[Any, ...] | dict[str, Any]) -> list[tuple[Any, ...]]:
        return self._retrying(lambda conn: conn.run(sql, args).fetchall())

    def lookup(self, user_id: str, request_id: str) -> tuple[bytes, bytes] | None:
        rows = self._read("SELECT fingerprint, response FROM recsvc_requests WHERE user_id=%s AND request_id=%s",
                          (user_id, request_id))
        return None if not rows else (bytes(rows[0][0]), bytes(rows[0][1]))

    def user(self, user_id: str) -> UserBudget:
        rows = self._read("SELECT spent_units, window_start, requests FROM recsvc_budgets WHERE user_id=%s", (user_id,))
        row = None if not rows else (int(rows[0][0]), int(rows[0][1]), int(rows[0][2]))
        return account(user_id, self.budget_units, self.window, row, self._clock())

    def totals(self) -> dict[str, float]:
        """Every user's ε spent in the current window."""
        rows = self._read("SELECT user_id, spent_units, window_start FROM recsvc_budgets", ())
        return {u: to_epsilon(s) for u, s in self.window.spent_now(rows, self._clock()).items()}

    # -- the writes ----------------------------------------------------------------------

    def draw_and_charge(self, user_id: str, request_id: str, digest: bytes, epsilon: float,
                        draw: Callable[[], S], build_response: Callable[[S, float], bytes], *,
                        mechanism: str = "") -> Charge:
        """The protocol of :meth:`recsvc.service.ledger.Ledger.draw_and_charge`: pre-check on a
        snapshot, draw holding no lock, then one transaction that decides again and stores."""
        p = Pending(user_id, request_id, self.fingerprint(digest), charge_units(epsilon), unset, mechanism)
        return draw_then_commit(self, p, draw, build_response)

    def _precheck(self, p: Pending) -> Charge | None:
        """:func:`precheck` on a snapshot, holding no lock: it rides in the next round of this
        process (:meth:`_group`) with the charges and pre-checks queued meanwhile."""
        return self._commit_all.one(_Probe(pending=p))  # type: ignore[no-any-return]

    def _answer(self, probes: list[_Probe], rows: list[tuple[Any, ...]]) -> None:
        """Each pre-check's verdict from its row of :data:`sql.PRECHECKS`; its charge remembers the
        account it read (``seen``) for :meth:`_charge_unchanged`."""
        now = self._clock()
        for q, row in zip(probes, rows, strict=True):
            try:
                q.result = precheck(q.pending, row[:4], self.window, self.budget_units, now)
            except LedgerError as exc:
                q.error = exc
            q.pending.seen = sql.account(row)

    def charge(self, user_id: str, request_id: str, digest: bytes, epsilon: float,
               build_response: Callable[[float], bytes], *, mechanism: str = "") -> Charge:
        """Atomically: replay a stored answer, or check the budget, spend ε and store the answer
        (see :meth:`recsvc.service.ledger.Ledger.charge`). Returns only after COMMIT."""
        return self._commit(Pending(user_id, request_id, self.fingerprint(digest), charge_units(epsilon),
                                    build_response, mechanism))

    def _commit(self, p: Pending) -> Charge:
        return self._commit_all.one(p)  # type: ignore[no-any-return]

    def _group(self, take: Callable[[], list[Queued]]) -> None:
        """The round's leader (:class:`GroupCommit`): everything queued by now, charges and
        pre-checks, first as ONE statement (:meth:`_charge_unchanged`), then the charges it left in
        ONE locking transaction (:meth:`_transaction`). Sets each item's ``result``/``error``. A
        failed statement refuses every pre-check it took (none may draw) and, with an unreachable
        database, every charge not yet stored (:class:`LedgerUnavailable`: nothing is known to be
        stored, a retry with the same request_id finds out)."""
        self._round(take())

    def _round(self, batch: list[Queued]) -> None:
        """:meth:`_group`'s work on ``batch``. A statement that fails on one item's values (a
        data or integrity error, which validation should have stopped) stored nothing of the
        items it held: they are done again one at a time, so only that item fails, never the other
        users' requests that shared its round."""
        probes = [q for q in batch if isinstance(q, _Probe)]
        rest = charges = [q for q in batch if isinstance(q, Pending)]
        try:
            rest, rows = self._retrying(lambda conn: self._charge_unchanged(conn, charges, probes))
            if rows is None and probes:  # the statement was rolled back: the pre-checks read on their own
                rows = self._read(sql.PRECHECKS, _keys(probes))
            self._answer(probes, rows or [])
            probes = []
            for attempt in range(_DEADLOCK_TRIES):
                try:
                    if rest:
                        self._retrying(lambda conn: self._transaction(conn, rest))
                    break
                except psycopg.errors.DeadlockDetected:  # rolled back whole; the lock order makes it rare
                    if attempt == _DEADLOCK_TRIES - 1:
                        raise
        except Exception as exc:  # noqa: BLE001 - every pre-check and every charge not yet stored is refused
            left: list[Queued] = [*probes, *rest]
            if isinstance(exc, _ITEM_ERRORS) and len(left) > 1:
                for q in left:
                    self._round([q])
                return
            for q in left:
                q.result, q.error = None, exc
            return
        for p in rest:  # our own COMMIT went through before a connection failure
            if p.result is not None and p.result.replayed and p.built is not None and p.result.response == p.built:
                p.result = Charge(p.result.response, replayed=False)

    def _charge_unchanged(self, conn: _Connection, batch: list[Pending],
                          probes: list[_Probe]) -> tuple[list[Pending], list[tuple[Any, ...]] | None]:
        """Optimistic concurrency for the charges whose pre-check read their user's account
        (``seen``): decided on those accounts, then ONE autocommit statement (its own
        transaction, durable when it returns) that locks, in user_id order, the accounts still
        exactly as read, creates the missing ones, moves them on and stores those users' answers;
        the same statement reads the ``probes``' stored requests and accounts on its snapshot (as
        before its own writes). An account only moves forward (each charge adds a request to its
        window or starts a later window), so "unchanged" means that no charge of the user, from
        any replica, committed since the snapshot, which also found each request unstored: the
        decisions are the ones the locking transaction would make. Returns the charges it did not
        decide (not read, a user read twice differently, or an account that moved: nothing of
        theirs was stored), and the probes' rows (None if the statement was rolled back)."""
        seen: dict[str, Any] = {}
        for p in batch:
            seen[p.user_id] = p.seen if seen.get(p.user_id, p.seen) == p.seen else False
        tried = [p for p in batch if seen[p.user_id] is not False]
        now = self._clock()
        writes = decide_all(tried, {}, {u: a for u, a in seen.items() if a}, self.window, self.budget_units, now)
        if not writes.requests:
            return batch, (conn.run(sql.PRECHECKS, _keys(probes)).fetchall() if probes else [])
        accounts = sorted(writes.users)  # the UPDATE locks the rows in this order, as the locking transaction does
        # −1, never a stored value, for "no row read": an all-NULL array would be sent with another
        # type than a bigint one, and psycopg would prepare the statement a second time for it.
        before = [seen[u] or (-1, -1, -1) for u, *_ in accounts]
        args = (*sql.columns(accounts, sql.ACCOUNT), *sql.columns(before, sql.SEEN),
                datetime.fromtimestamp(now, UTC), *sql.columns(writes.requests, sql.REQUEST))
        rows: list[tuple[Any, ...]] | None = []
        try:
            if probes:
                out = conn.run(sql.CHARGE_AND_PRECHECK, (*args, *_keys(probes))).fetchall()
                charged = {u for i, u, *_ in out if i is None}
                rows = [r[2:] for r in sorted((r for r in out if r[0] is not None), key=lambda r: r[0])]
            else:
                charged = {u for u, in conn.run(sql.CHARGE_UNCHANGED, args)}
        except (psycopg.errors.DeadlockDetected, psycopg.errors.UniqueViolation):
            charged, rows = set(), None  # nothing stored (one statement); the locking transaction decides them all
        if charged:
            self.commits += 1
        rest = [p for p in batch if p.user_id not in charged]
        moved = {u for u, *_ in writes.users} - charged
        relocked = sum(p.user_id in moved for p in rest)
        if relocked:
            self.moved += relocked
            metrics.RELOCKED.inc(relocked)
        return rest, rows

    def _transaction(self, conn: _Connection, batch: list[Pending]) -> None:
        """Three round trips: [BEGIN, create missing budget rows, lock the users' rows in user_id
        order (two transactions never wait on each other in a cycle), read the stored requests]
        as one multi-statement query (client-side binding of a few short strings), decide, then
        [store the answers and update the budgets] as one prepared statement, then COMMIT.
        READ COMMITTED: each statement reads a fresh snapshot, so the stored requests are read
        after the locks are granted and include every charge committed before."""
        users = sorted({p.user_id for p in batch})
        keys = list({(p.user_id, p.request_id): None for p in batch})
        cur = psycopg.ClientCursor(conn)
        try:
            cur.execute(sql.lock_and_read(len(users), len(keys)), [*users, *users, *(v for k in keys for v in k)])
            locked, found = _result_sets(cur)
            accounts = {u: (int(sp), int(ws), int(n)) for u, sp, ws, n in locked}
            stored = {(u, q): (bytes(fp), bytes(r)) for u, q, fp, r in found}
            now = self._clock()  # read under the row locks: the window these charges count in
            writes = decide_all(batch, stored, accounts, self.window, self.budget_units, now)
            if writes.requests:  # server-side binding: the answers travel as binary, not as SQL text
                conn.run(sql.WRITE, (datetime.fromtimestamp(now, UTC), *sql.columns(writes.requests, sql.REQUEST),
                                     *sql.columns(writes.users, sql.ACCOUNT)))
            conn.run("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise
        self.commits += 1  # COMMIT returned: the WAL is flushed

    def _snapshot(self, keys: list[tuple[str, str]], users: list[str]) -> tuple[
            dict[tuple[str, str], tuple[bytes, bytes]], dict[str, tuple[int, int, int]]]:
        """The batch pre-check's read, holding no lock: the pre-checks' statement (``users`` are
        the keys' users)."""
        rows = self._read(sql.PRECHECKS, tuple(sql.columns(keys, sql.KEY)))
        stored = {k: (bytes(fp), bytes(r)) for k, (fp, r, *_) in zip(keys, rows, strict=True) if fp is not None}
        return stored, {k[0]: a for k, row in zip(keys, rows, strict=True) if (a := sql.account(row)) is not None}


_DEADLOCK_TRIES = 3
# What one item's values can make a statement fail with (not the database or the connection).
_ITEM_ERRORS = (psycopg.DataError, psycopg.IntegrityError)


@dataclass(eq=False)
class _Probe(Queued):
    """A charge's pre-check, queued for the next round (:meth:`PostgresLedger._group`);
    ``result``: a stored answer to replay, or None."""

    pending: Pending


def _keys(probes: list[_Probe]) -> tuple[BinaryArray, ...]:
    """:data:`sql.PRECHECKS`' parameters."""
    return tuple(sql.columns([(q.pending.user_id, q.pending.request_id) for q in probes], sql.KEY))


def _result_sets(cur: psycopg.ClientCursor) -> list[list[tuple[Any, ...]]]:
    """The rows of every statement of a multi-statement query that returns rows, in order."""
    sets = []
    while True:
        if cur.description is not None:
            sets.append(cur.fetchall())
        if not cur.nextset():
            return sets


def _roll_back(conn: psycopg.Connection) -> None:
    """Ends a failed transaction on a connection that still works (the pool discards a broken one)."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            pass


