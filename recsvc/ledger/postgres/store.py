"""The privacy ledger in PostgreSQL, shared by several `recsvc serve` replicas.

Same protocol (:class:`recsvc.ledger.base.Ledger`) and invariants as the SQLite store
(:class:`recsvc.ledger.sqlite.SQLiteLedger`):

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
  (:class:`recsvc.ledger.group_commit.GroupCommit`): it stores the charges and reads the
  pre-checks on its snapshot, so a Select costs about half a statement under load; a SelectBatch
  is one commit; rows are locked in user_id order, so no lock cycle forms.
* **Index lookups only.** Every pooled connection runs with ``enable_seqscan`` off and generic
  plans: the prepared statements' arrays hide their sizes from the planner, and a plan cached
  while the tables were small must not scan every user's row once they are large.
* **Durable before the answer leaves.** ``synchronous_commit = on`` for every pooled connection;
  the answer is stored with its spend and returned only after COMMIT returned. PostgreSQL groups
  the WAL flushes of concurrent commits itself, so charges of different users share fsyncs.
* **Idempotent**, **exact units**, **keyed fingerprints**, **no sampling under the lock**: as in
  the SQLite store (:mod:`recsvc.ledger.charging` holds the shared rule).
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

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from recsvc.checks import ParamError
from recsvc.ledger import fingerprint
from recsvc.ledger.base import Accounts, Ledger, LedgerObserver, Stored
from recsvc.ledger.charging import (
    N_STORED,
    STORED_COLUMNS,
    Account,
    Charge,
    Pending,
    PrecheckRow,
    Seen,
    StoredRequest,
    decide_all,
)
from recsvc.ledger.errors import LedgerUnavailable
from recsvc.ledger.group_commit import GroupCommit, Queued
from recsvc.ledger.postgres import schema
from recsvc.ledger.postgres.arrays import BinaryArray
from recsvc.ledger.postgres.clock import DatabaseClock
from recsvc.ledger.postgres.connection import (
    Connection,
    configure,
    link_timeouts,
    result_sets,
    roll_back,
    wait_options,
)
from recsvc.ledger.postgres.schema import connect, describe, scrub
from recsvc.ledger.postgres.statements import (
    ACCOUNT,
    CHARGE_AND_PRECHECK,
    CHARGE_UNCHANGED,
    KEY,
    PRECHECKS,
    REQUEST,
    SEEN,
    WRITE,
    columns,
    lock_and_read,
    seen_account,
)
from recsvc.ledger.waits import CONNECT_S, DEFAULT_WAITS, Waits
from recsvc.ledger.window import LIFETIME_WINDOW, BudgetWindow

T = TypeVar("T")
log = logging.getLogger("recsvc.ledger")
_DOWN = (psycopg.OperationalError, PoolTimeout)


# What a caller refused with UNAVAILABLE should do: a charge may have been stored; a read changed nothing.
_RETRY_CHARGE = "nothing was charged unless the answer was stored, so retry with the same request_id"
_RETRY_READ = "nothing was read or changed; retry later"


class PostgresLedger(Ledger):
    """The ledger in a PostgreSQL database (thread-safe, shared by several replicas).

    ``create=True`` (``recsvc ledger init``) creates the schema and the key file if missing and
    stores the settings; otherwise the database must hold a ledger with this budget, budget
    window and key. ``clock`` (Unix seconds) places each charge in its window: by default the
    database server's clock (:mod:`.clock`), so a replica whose clock is wrong never renews a
    budget early; tests inject one. ``timeout_s``: this replica's connection timeout
    (:data:`recsvc.ledger.waits.CONNECT_S`: the pool's wait and retries, libpq's link timeouts).
    """

    def __init__(
        self,
        url: str,
        budget: float,
        key_file: str | os.PathLike[str],
        pool_size: int = 8,
        timeout_s: float = CONNECT_S,
        create: bool = False,
        window: BudgetWindow | str = LIFETIME_WINDOW,
        clock: Callable[[], float] | None = None,
        observer: LedgerObserver | None = None,
        waits: Waits = DEFAULT_WAITS,
    ) -> None:
        super().__init__(budget, window, clock, observer)
        self.waits = waits
        self._group_commit = _SettingAside(self._commit_group, self._charge_held)
        if pool_size < 1:
            raise ParamError("{ledger_pool} must be >= 1, got {got}", got=pool_size)
        self.where = describe(url)
        self.url = url
        self.key_file = Path(key_file)
        self.moved = 0  # charges whose account moved after their pre-check: decided under the lock
        self._probe: psycopg.Connection | None = None  # reachable()'s own connection
        self._probe_lock = threading.Lock()
        if create:
            fingerprint.check(self.key_file)
            self._key, self.key_created = fingerprint.load_or_create(self.key_file)
        else:
            self._key = fingerprint.load(self.key_file)
        connect_timeout = max(1, round(timeout_s))
        try:
            with connect(url, self.where, connect_timeout) as conn:
                if create:
                    schema.init(conn, self.where, self.budget_units, self._key, self.window)
                else:
                    schema.check(conn, self.where, self.budget_units, self._key, self.window)
                if clock is None:  # budget windows by the database's clock, never this replica's
                    self._clock = DatabaseClock(lambda: connect(url, self.where, connect_timeout), conn)
        except BaseException:
            if self.key_created:
                self.key_file.unlink(missing_ok=True)
            raise
        # reconnect_timeout: a slot that failed to reconnect for timeout_s is given up, and the next
        # request grows the pool again with an immediate attempt, so service resumes as soon as the
        # server is back instead of after a long exponential backoff.
        self._pool = ConnectionPool(
            url,
            min_size=pool_size,
            max_size=pool_size,
            timeout=timeout_s,
            open=False,
            reconnect_timeout=timeout_s,
            # prepared on their first execution, not after psycopg's default 5, each
            # planned until then: every statement here repeats on every connection.
            kwargs={
                "autocommit": True,
                "prepare_threshold": 0,
                "options": wait_options(waits),
                **link_timeouts(timeout_s),
            },
            connection_class=Connection,
            configure=configure,
            name="recsvc-ledger",
        )
        self._pool.open(wait=True, timeout=timeout_s * 2)

    def _unavailable(self, exc: BaseException, then: str) -> LedgerUnavailable:
        reason = scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, self.url)
        return LedgerUnavailable(f"the PostgreSQL ledger at {self.where} is unavailable ({reason}); {then}")

    def _waited_too_long(self, exc: BaseException, then: str) -> LedgerUnavailable:
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            what = f"waited past lock_timeout (at most {self.waits.lock_s:g} s) for a lock another session holds"
        else:
            what = f"ran longer than statement_timeout ({self.waits.statement_s:g} s)"
        log.warning("the PostgreSQL ledger at %s: a statement %s; refused UNAVAILABLE", self.where, what)
        return LedgerUnavailable(f"the PostgreSQL ledger at {self.where} is busy (a statement {what}); {then}")

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
                        self._probe = psycopg.connect(
                            self.url, autocommit=True, application_name="recsvc-probe", **link_timeouts(2.0)
                        )
                    self._probe.execute("SELECT 1")  # type: ignore[union-attr]  # set just above when not reused
                    return True
                except psycopg.Error:
                    if self._probe is not None:
                        self._probe.close()
                    self._probe = None
                    if not reused or time.monotonic() - t0 > 1.0:  # down or cut off, not just a stale socket
                        return False

    # -- reads ---------------------------------------------------------------------------

    def _retrying(self, fn: Callable[[Connection], T], then: str = _RETRY_CHARGE) -> T:
        """``fn`` on a pooled connection; after a connection failure (the server restarted, the
        pool still holds dead connections) once more on a checked one, then UNAVAILABLE, whose
        message ends with ``then`` (what the caller should do). Safe for charges too: the retry
        decides again on what is stored."""
        for attempt in range(2):
            try:
                with self._pool.connection() as conn:
                    return fn(conn)
            except psycopg.errors.DeadlockDetected:  # an OperationalError, but the server is up
                raise
            except _WAITED as exc:  # the server is up; the transaction was rolled back
                raise self._waited_too_long(exc, then) from None
            except _DOWN as exc:
                # Unreachable now (down, or a partition): fail fast rather than also wait on the
                # pool's other, equally dead connections.
                if attempt == 1 or isinstance(exc, PoolTimeout) or not self.reachable():
                    raise self._unavailable(exc, then) from None
                self._pool.check()  # drop the connections that died with the server
        raise AssertionError("unreachable")

    def _read(
        self, sql: str, args: tuple[Any, ...] | dict[str, Any], then: str = _RETRY_CHARGE
    ) -> list[tuple[Any, ...]]:
        return self._retrying(lambda conn: conn.run(sql, args).fetchall(), then)

    def lookup(self, user_id: str, request_id: str) -> StoredRequest | None:
        rows = self._read(
            f"SELECT {STORED_COLUMNS} FROM recsvc_requests WHERE user_id=%s AND request_id=%s", (user_id, request_id)
        )
        return None if not rows else StoredRequest.of(*rows[0])

    def _account(self, user_id: str) -> Account | None:
        rows = self._read(
            "SELECT spent_units, window_start, requests FROM recsvc_budgets WHERE user_id=%s", (user_id,), _RETRY_READ
        )
        return None if not rows else Account(int(rows[0][0]), int(rows[0][1]), int(rows[0][2]))

    def _all_accounts(self) -> Accounts:
        rows = self._read("SELECT user_id, spent_units, window_start, requests FROM recsvc_budgets", (), _RETRY_READ)
        return {u: Account(int(s), int(ws), int(n)) for u, s, ws, n in rows}

    def _precheck_row(self, p: Pending) -> PrecheckRow:
        """Rides in the next round of this process (:meth:`_commit_group`) with the charges and
        pre-checks queued meanwhile: one statement reads them all on its snapshot."""
        return cast(PrecheckRow, self._group_commit.one(_Probe(pending=p)))

    def _answer(self, probes: list[_Probe], rows: list[tuple[Any, ...]]) -> None:
        """Each pre-check's row of :data:`PRECHECKS` (the rule is applied by its caller); its
        charge remembers the account it read (``seen``) for :meth:`_charge_unchanged`."""
        for q, row in zip(probes, rows, strict=True):
            account = seen_account(row)
            q.result = PrecheckRow(_stored_of(row), account)
            q.pending.seen = Seen(account)

    # -- the writes ----------------------------------------------------------------------

    def _commit_group(self, take: Callable[[], list[Queued]]) -> None:
        """The round's leader: everything queued by now, charges and pre-checks, first as ONE
        statement (:meth:`_charge_unchanged`), then the charges it left in ONE locking
        transaction (:meth:`_transaction`). Sets each item's ``result``/``error``. A failed
        statement refuses every pre-check it took (none may draw) and, with an unreachable
        database, every charge not yet stored (:class:`~recsvc.ledger.errors.LedgerUnavailable`:
        nothing is known to be stored, a retry with the same request_id finds out)."""
        self._round(take())

    def _round(self, batch: list[Queued]) -> None:
        """:meth:`_commit_group`'s work on ``batch``. A statement that fails on one item's values (a
        data or integrity error, which validation should have stopped) stored nothing of the
        items it held: they are done again one at a time, so only that item fails, never the other
        users' requests that shared its round."""
        probes = [q for q in batch if isinstance(q, _Probe)]
        rest = charges = [q for q in batch if isinstance(q, Pending)]
        try:
            rest, rows = self._retrying(lambda conn: self._charge_unchanged(conn, charges, probes))
            if rows is None and probes:  # the statement was rolled back: the pre-checks read on their own
                rows = self._read(PRECHECKS, _keys(probes))
            self._answer(probes, rows or [])
            probes = []
            self._locking(rest, wait=False)
        except Exception as exc:  # every pre-check and every charge not yet stored is refused
            left: list[Queued] = [*probes, *rest]
            if isinstance(exc, _ITEM_ERRORS) and len(left) > 1:
                for q in left:
                    self._round([q])
                return
            for q in left:
                q.result, q.error = None, exc

    def _charge_unchanged(
        self, conn: Connection, batch: list[Pending], probes: list[_Probe]
    ) -> tuple[list[Pending], list[tuple[Any, ...]] | None]:
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
        seen: dict[str, Account | None] = {}
        unread: set[str] = set()  # users some charge did not read, or two charges read differently
        for p in batch:
            if p.seen is None or seen.setdefault(p.user_id, p.seen.account) != p.seen.account:
                unread.add(p.user_id)
        tried = [p for p in batch if p.user_id not in unread]
        now = self._clock()
        accounts = {u: a for u, a in seen.items() if a is not None and u not in unread}
        writes = decide_all(tried, {}, accounts, self.window, self.budget_units, now)
        if not writes.requests:
            return batch, (conn.run(PRECHECKS, _keys(probes)).fetchall() if probes else [])
        moving = sorted(writes.users)  # the UPDATE locks the rows in this order, as the locking transaction does
        # −1, never a stored value, for "no row read": an all-NULL array would be sent with another
        # type than a bigint one, and psycopg would prepare the statement a second time for it.
        before = [seen[w.user_id] or Account(-1, -1, -1) for w in moving]
        args = (
            *columns(moving, ACCOUNT),
            *columns(before, SEEN),
            datetime.fromtimestamp(now, UTC),
            *columns([r.row() for r in writes.requests], REQUEST),
        )
        rows: list[tuple[Any, ...]] | None = []
        try:
            if probes:
                out = conn.run(CHARGE_AND_PRECHECK, (*args, *_keys(probes))).fetchall()
                charged = {u for i, u, *_ in out if i is None}
                rows = [r[2:] for r in sorted((r for r in out if r[0] is not None), key=lambda r: r[0])]
            else:
                charged = {u for (u,) in conn.run(CHARGE_UNCHANGED, args)}
        except (psycopg.errors.DeadlockDetected, psycopg.errors.UniqueViolation, psycopg.errors.LockNotAvailable):
            # Nothing stored (one statement; a lock wait past ROUND_LOCK_S: another session holds a
            # row): the locking transaction decides them all, skipping rows held elsewhere.
            charged, rows = set(), None
        if charged:
            self.commits += 1
        rest = [p for p in batch if p.user_id not in charged]
        moved = {w.user_id for w in writes.users} - charged
        relocked = sum(p.user_id in moved for p in rest)
        if relocked:
            self.moved += relocked
            self.observer.relocked(relocked)
        return rest, rows

    def _transaction(self, conn: Connection, batch: list[Pending], wait: bool = False) -> None:
        """Three round trips: [BEGIN, create missing budget rows, lock the users' rows in user_id
        order (two transactions never wait on each other in a cycle), read the stored requests]
        as one multi-statement query (client-side binding of a few short strings), decide, then
        [store the answers and update the budgets] as one prepared statement, then COMMIT.
        READ COMMITTED: each statement reads a fresh snapshot, so the stored requests are read
        after the locks are granted and include every charge committed before.

        Without ``wait`` (the round's leader) the rows another session holds are skipped: their
        users' charges are set aside (:class:`_Held`, nothing decided) for their callers to
        charge in their own threads (:meth:`_charge_held`), so one user's locked row stalls only
        that user. With ``wait`` the rows are waited for, at most ``lock_timeout``."""
        users = sorted({p.user_id for p in batch})
        keys = list({(p.user_id, p.request_id): None for p in batch})
        cur = psycopg.ClientCursor(conn)
        try:
            cur.execute(
                lock_and_read(len(users), len(keys), skip=not wait, lock_ms=self.waits.lock_ms),
                [*users, *users, *(v for k in keys for v in k)],
            )
            locked, found = result_sets(cur)
            accounts = {u: Account(int(sp), int(ws), int(n)) for u, sp, ws, n in locked}
            held = [p for p in batch if p.user_id in accounts]
            for p in batch:
                if p.user_id not in accounts:  # locked by another session: never decided without its row
                    p.result, p.error = None, _Held(self.where)
            stored = {(u, q): StoredRequest.of(*rest) for u, q, *rest in found}
            now = self._clock()  # read under the row locks: the window these charges count in
            writes = decide_all(held, stored, accounts, self.window, self.budget_units, now)
            if writes.requests:  # server-side binding: the answers travel as binary, not as SQL text
                conn.run(
                    WRITE,
                    (
                        datetime.fromtimestamp(now, UTC),
                        *columns([r.row() for r in writes.requests], REQUEST),
                        *columns(writes.users, ACCOUNT),
                    ),
                )
            conn.run("COMMIT")
        except BaseException:
            roll_back(conn)
            raise
        self.commits += 1  # COMMIT returned: the WAL is flushed

    def _locking(self, rest: list[Pending], wait: bool) -> None:
        """``rest`` through :meth:`_transaction`, again after a deadlock (rolled back whole; the
        lock order makes it rare); a charge found stored with the answer this process built is its
        own COMMIT that went through before a connection failure."""
        for attempt in range(_DEADLOCK_TRIES):
            try:
                if rest:
                    self._retrying(lambda conn: self._transaction(conn, rest, wait))
                break
            except psycopg.errors.DeadlockDetected:
                if attempt == _DEADLOCK_TRIES - 1:
                    raise
        for p in rest:
            if p.result is not None and p.result.replayed and p.built is not None and p.result.answer == p.built:
                p.result = Charge(p.result.answer, replayed=False)

    def _charge_held(self, items: list[Queued]) -> None:
        """The charges a round set aside (their rows were locked elsewhere), in their caller's
        thread: one locking transaction that waits for the rows, at most ``lock_timeout``; past it
        UNAVAILABLE, rolled back, nothing spent."""
        pending = cast("list[Pending]", items)
        try:
            self._locking(pending, wait=True)
        except Exception as exc:
            for p in pending:
                p.result, p.error = None, exc

    def _snapshot(self, keys: list[tuple[str, str]], users: list[str]) -> tuple[Stored, Accounts]:
        """The batch pre-check's read, holding no lock: the pre-checks' statement (``users`` are
        the keys' users)."""
        rows = self._read(PRECHECKS, tuple(columns(keys, KEY)))
        stored = {k: found for k, row in zip(keys, rows, strict=True) if (found := _stored_of(row)) is not None}
        return stored, {k[0]: a for k, row in zip(keys, rows, strict=True) if (a := seen_account(row)) is not None}


_DEADLOCK_TRIES = 3
# The server-side timeouts (:mod:`recsvc.ledger.waits`): the statement was cancelled, rolled back.
_WAITED = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)


class _Held(LedgerUnavailable):
    """A charge a round set aside, undecided, because another session holds its user's row; its
    caller charges it (:meth:`PostgresLedger._charge_held`). UNAVAILABLE if it ever escaped."""

    def __init__(self, where: str) -> None:
        super().__init__(f"the PostgreSQL ledger at {where}: this user's budget row is locked by another session")


class _SettingAside(GroupCommit):
    """Group commit whose callers then charge, in their own threads, what the round set aside."""

    def __init__(self, commit: Callable[[Callable[[], list[Any]]], None], held: Callable[[list[Queued]], None]):
        super().__init__(commit)
        self._held = held

    def __call__(self, items: list[Any]) -> None:
        super().__call__(items)
        waiting = [q for q in items if isinstance(q.error, _Held)]
        if waiting:
            self._held(waiting)


# What one item's values can make a statement fail with (not the database or the connection).
_ITEM_ERRORS = (psycopg.DataError, psycopg.IntegrityError)


@dataclass(eq=False)
class _Probe(Queued):
    """A charge's pre-check, queued for the next round (:meth:`PostgresLedger._commit_group`);
    ``result``: its :class:`~recsvc.ledger.charging.PrecheckRow`."""

    pending: Pending


def _stored_of(row: tuple[Any, ...]) -> StoredRequest | None:
    """The stored request of a :data:`PRECHECKS` row (its first columns); None: not stored."""
    return None if row[0] is None else StoredRequest.of(*row[:N_STORED])


def _keys(probes: list[_Probe]) -> tuple[BinaryArray, ...]:
    """:data:`PRECHECKS`' parameters."""
    return tuple(columns([(q.pending.user_id, q.pending.request_id) for q in probes], KEY))
