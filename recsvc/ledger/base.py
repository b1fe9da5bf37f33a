"""The ledger interface and the abstract store under it: reserve, then commit, once.

:class:`Ledger` is what the service depends on: a typed budget store. It owns the protocol every
store follows, so a store implements only its storage primitives (the abstract methods, each a
read or a transaction). The caller's path is linear, and the ledger never calls back into it:

1. :meth:`Ledger.reserve`: ε becomes exact units (:func:`recsvc.ledger.units.charge_units`), or
   :class:`~recsvc.ledger.units.InvalidCharge` before the ledger is touched. The request takes
   its turn: callers of the same (user_id, request_id) in this process wait for one another
   (:class:`~recsvc.ledger.group_commit.Flights`) until the holder's reservation is released,
   so concurrent duplicates draw once: the later ones find the stored answer. Then a pre-check
   on a read snapshot, holding no lock and writing nothing (``_precheck_row``): a stored answer is
   a :class:`~recsvc.ledger.charging.Replay`, another fingerprint is a conflict, an exhausted
   budget is refused (:func:`recsvc.ledger.charging.precheck`). Otherwise a :class:`Reservation`.
2. The caller draws, holding no ledger lock, so its cost (random stopping makes about 1/γ draws)
   delays no other request's charge.
3. :meth:`Ledger.commit` with the :class:`~recsvc.ledger.charging.Drawn` items: group commit
   (:class:`~recsvc.ledger.group_commit.GroupCommit`, the store's ``_commit_group``): the charges
   queued meanwhile share one transaction, which decides each again by the same rule
   (:func:`recsvc.ledger.charging.decide_all`) and stores the typed
   :class:`~recsvc.ledger.charging.StoredAnswer` with the spend. It returns the answer with the
   budget left after it; the caller encodes it once.
4. The reservation is released (it is a context manager), drawn or not.

If step 3 finds that the request became a replay (another worker committed the same request
first), a conflict, or over budget (the user's other requests spent it in the meantime), the
drawn sample is discarded unreleased. A sample that is never released reveals nothing about the
data, so discarding it costs no privacy: each released answer is charged exactly once, and a
retry gets the stored answer, never a fresh sample.

SelectBatch (:meth:`Ledger.reserve_batch`, :meth:`Ledger.commit_batch`) follows the same steps for
many requests at once: keys taken in sorted order (two batches never wait on each other in a
cycle), one snapshot (``_snapshot``), one vectorised draw by the caller, one group commit. Items
are charged in batch order, each against what remains (in the current budget window, one clock
reading for the whole transaction) after the items before it; an item that does not fit is
refused and a LATER, smaller item that still fits is charged. An item repeating an earlier
item's (user_id, request_id) within the batch replays that item's answer (or conflicts).

Metrics reach the service through a :class:`LedgerObserver` given at construction.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Self, cast

from recsvc.ledger import fingerprint
from recsvc.ledger.budget import checked_units
from recsvc.ledger.charging import (
    Account,
    Charge,
    Drawn,
    Pending,
    PrecheckRow,
    Replay,
    Seen,
    StoredRequest,
    UserBudget,
    account,
    precheck,
    verdict,
)
from recsvc.ledger.errors import LedgerError
from recsvc.ledger.group_commit import Flights, GroupCommit, Queued, Turns
from recsvc.ledger.units import charge_units, to_epsilon
from recsvc.ledger.window import LIFETIME_WINDOW, BudgetWindow

URL_SCHEMES = ("postgresql://", "postgres://")
# Seconds a running commit may take before health calls the charge pipeline stuck: a commit takes
# milliseconds; a wait this long is on another session's lock or a stopped database.
STALL_S = 3.0

# The stored requests by (user_id, request_id), and each user's stored account, as a store's reads
# return them.
Stored = dict[tuple[str, str], StoredRequest]
Accounts = dict[str, Account]


# Set by without_waiting(): a store's commit then refuses (WouldWait) instead of waiting for a lock.
NO_WAIT: ContextVar[bool] = ContextVar("recsvc_ledger_no_wait", default=False)


class without_waiting:  # lower case: it reads as a call, ``with without_waiting():``
    """Within it, a commit that would wait for a lock another process or thread holds raises
    :class:`~recsvc.ledger.errors.WouldWait` instead, nothing stored or spent (SQLite; a drawn
    sample is discarded unreleased). The service runs a lone call on the event loop this way
    (a class, not a generator: it is entered on every lone call)."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = NO_WAIT.set(True)

    def __exit__(self, *exc: object) -> None:
        NO_WAIT.reset(self._token)


def is_postgres(ledger: object) -> bool:
    """True when ``--ledger`` is a libpq URL (postgresql://user@host:port/db), not an SQLite path."""
    return isinstance(ledger, str) and ledger.startswith(URL_SCHEMES)


def _ignore(_n: int) -> None:
    pass


@dataclass(frozen=True)
class LedgerObserver:
    """Callbacks through which the ledger reports what the service counts (its metrics); each a
    no-op unless given. They run on the committing thread, so they must be cheap."""

    # PostgreSQL: drawn charges decided under the user's row lock because the account moved
    # after their pre-check read it (another request or replica charged the user meanwhile).
    relocked: Callable[[int], None] = _ignore


@dataclass(frozen=True)
class BatchItem:
    """One request of a batch, as the ledger sees it."""

    user_id: str
    request_id: str
    digest: bytes  # SHA-256 of the canonical request (the ledger stores its keyed fingerprint)
    epsilon: float
    mechanism: str = ""  # the answer's mechanism, stored with it (``recsvc ledger export``)


class _Turn:
    """Holds a request's turn until released (idempotent); as a context manager, released on exit."""

    def __init__(self, turn: Turns) -> None:
        self._turn = turn

    def release(self) -> None:
        """Ends the request's turn: a waiting duplicate then finds its stored answer."""
        self._turn.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class Reservation(_Turn):
    """A request that passed its pre-check and holds its turn (:meth:`Ledger.reserve`): commit it
    with what was drawn (:meth:`Ledger.commit`), then release it, drawn or not; as a context
    manager it is released on exit. Nothing is written until the commit."""

    def __init__(self, pending: Pending, turn: Turns) -> None:
        super().__init__(turn)
        self.pending = pending


class BatchReservation(_Turn):
    """A batch's reservation (:meth:`Ledger.reserve_batch`): ``outcomes[i]`` is item i's replay
    (a :class:`~recsvc.ledger.charging.Charge`) or refusal decided by the pre-check, None for the
    items to draw, whose indices are ``todo`` in order. Released like a :class:`Reservation`."""

    def __init__(
        self, pending: dict[int, Pending], outcomes: list[Charge | Exception | None], todo: list[int], turn: Turns
    ) -> None:
        super().__init__(turn)
        self.pending = pending
        self.outcomes = outcomes
        self.todo = todo


class Ledger(abc.ABC):
    """A privacy ledger: per-user ε under basic composition, exact, idempotent and durable.

    ``budget`` is ε per user per budget ``window`` (:mod:`recsvc.ledger.window`); ``clock``
    (Unix seconds) places each charge in its window (tests inject one; by default this host's
    clock, and the database's for PostgreSQL). ``where`` names the
    store in messages (never a password); ``commits`` counts this process's transactions and
    ``key_created`` says whether this open created the fingerprint key file.
    """

    where: str

    def __init__(
        self,
        budget: float,
        window: BudgetWindow | str = LIFETIME_WINDOW,
        clock: Callable[[], float] | None = None,
        observer: LedgerObserver | None = None,
    ) -> None:
        units = checked_units(budget)
        self.budget_units = units
        self.budget = to_epsilon(units)
        self.window = BudgetWindow.parse(window)
        self.observer = observer or LedgerObserver()
        self._clock = (
            clock if clock is not None else time.time
        )  # a store may replace the default (PostgreSQL: the database's)
        self._key = b""  # the fingerprint key; each store loads or creates it
        self.key_created = False
        self.commits = 0
        self._flights = Flights()  # one reservation per (user_id, request_id) at a time
        self._group_commit = GroupCommit(self._commit_group)

    # -- the storage primitives each store implements --------------------------------------

    @abc.abstractmethod
    def lookup(self, user_id: str, request_id: str) -> StoredRequest | None:
        """An earlier request's stored fingerprint and answer, or None."""

    @abc.abstractmethod
    def _account(self, user_id: str) -> Account | None:
        """The user's stored account, or None."""

    @abc.abstractmethod
    def _all_accounts(self) -> Accounts:
        """Every user's stored account (for audits and tests)."""

    @abc.abstractmethod
    def _precheck_row(self, p: Pending) -> PrecheckRow:
        """The pre-check's read, holding no lock: ``p``'s stored request and its user's account."""

    @abc.abstractmethod
    def _snapshot(self, keys: list[tuple[str, str]], users: list[str]) -> tuple[Stored, Accounts]:
        """The batch pre-check's read, on one snapshot holding no lock: the stored requests among
        ``keys`` and each user's stored account."""

    @abc.abstractmethod
    def _commit_group(self, take: Callable[[], list[Queued]]) -> None:
        """The group-commit leader's transaction: calls ``take()`` once it is ready (holds its
        locks, has a connection) to get every charge queued by then, decides them by
        :func:`recsvc.ledger.charging.decide_all`, stores them, and sets each one's
        ``result`` or ``error``; returns only after the COMMIT is durable."""

    @abc.abstractmethod
    def reachable(self) -> bool:
        """Whether the store answers now (for health checks)."""

    def stalled(self) -> bool:
        """Whether the charge pipeline is stuck: its running commit has taken more than
        :data:`STALL_S` (another process holds the write lock, a lock wait on the database, a
        database that stopped answering mid-statement). Health reports NOT_SERVING meanwhile."""
        return self._group_commit.running_for() > STALL_S

    @abc.abstractmethod
    def close(self) -> None:
        """Releases the store's connections (and files)."""

    # -- reads ----------------------------------------------------------------------------

    def fingerprint(self, digest: bytes) -> bytes:
        """What the ledger stores for a request whose SHA-256 digest is ``digest``: HMAC(key, digest)."""
        return fingerprint.keyed(self._key, digest)

    def user(self, user_id: str) -> UserBudget:
        """The user's account in the current budget window."""
        return account(user_id, self.budget_units, self.window, self._account(user_id), self._clock())

    def totals(self) -> dict[str, float]:
        """Every user's ε spent in the current window (for audits and tests; exact values: :meth:`user`)."""
        return {u: to_epsilon(s) for u, s in self._spent_now(self._all_accounts()).items()}

    def _spent_now(self, accounts: Accounts) -> dict[str, int]:
        """Each user's spend in the current budget window, from their stored accounts."""
        return self.window.spent_now(((u, a.spent_units, a.window_start) for u, a in accounts.items()), self._clock())

    # -- the protocol ----------------------------------------------------------------------

    def reserve(
        self, user_id: str, request_id: str, digest: bytes, epsilon: float, mechanism: str = ""
    ) -> Reservation | Replay:
        """Step 1 of the module docstring: the stored answer of a request already answered, or a
        :class:`Reservation` holding the request's turn. ``digest`` is the request's SHA-256 (the
        ledger stores only its keyed fingerprint); ``mechanism`` is stored with the answer.
        Raises :class:`~recsvc.ledger.units.InvalidCharge` (before anything is touched),
        :class:`~recsvc.ledger.errors.BudgetExceeded` or
        :class:`~recsvc.ledger.errors.RequestConflict`; writes nothing."""
        p = Pending(user_id, request_id, self.fingerprint(digest), charge_units(epsilon), mechanism)
        turn = self._flights.take(((user_id, request_id),))
        try:
            done = self._precheck(p)
        except BaseException:
            turn.release()
            raise
        if done is not None:
            turn.release()
            return Replay(done.answer)
        return Reservation(p, turn)

    def _precheck(self, p: Pending) -> Charge | None:
        """The pre-check: :func:`recsvc.ledger.charging.precheck` on the store's snapshot read."""
        return precheck(p, self._precheck_row(p), self.window, self.budget_units, self._clock())

    def commit(self, reservation: Reservation, drawn: Drawn) -> Charge:
        """Step 3: charges the reserved request and stores ``drawn`` as its typed answer, in one
        transaction that decides again; the answer with the budget left after it. A replay if
        another process answered the request meanwhile; a refusal raised (nothing spent, the draw
        discarded). Returns only after the COMMIT (fsync)."""
        p = reservation.pending
        p.drawn = drawn
        return cast(Charge, self._group_commit.one(p))

    def charge(
        self, user_id: str, request_id: str, digest: bytes, epsilon: float, drawn: Drawn, mechanism: str = ""
    ) -> Charge:
        """Charges an answer known before the call (nothing to draw, so no pre-check): ONE
        transaction replays the stored answer, or refuses, or spends ε and stores ``drawn``, by the
        same rule as :meth:`commit` (:class:`~recsvc.ledger.units.InvalidCharge` before anything is
        touched). Returns only after the COMMIT."""
        p = Pending(user_id, request_id, self.fingerprint(digest), charge_units(epsilon), mechanism, drawn)
        return cast(Charge, self._group_commit.one(p))

    def reserve_batch(self, items: Sequence[BatchItem]) -> BatchReservation:
        """SelectBatch's step 1 (module docstring): every item's turn, taken in sorted key order,
        and the pre-check of all items on one snapshot. An item the pre-check decides (a replay, a
        conflict, a charge beyond what the user has left after the EARLIER items, an ε the ledger
        cannot count) has its outcome; the others are to be drawn."""
        out: list[Charge | Exception | None] = [None] * len(items)
        pending: dict[int, Pending] = {}
        for i, it in enumerate(items):
            try:
                units = charge_units(it.epsilon)
            except ValueError as exc:  # InvalidCharge: this item alone
                out[i] = exc
                continue
            pending[i] = Pending(it.user_id, it.request_id, self.fingerprint(it.digest), units, it.mechanism)
        turn = self._flights.take(sorted({(p.user_id, p.request_id) for p in pending.values()}))
        try:
            todo = self._precheck_batch(pending, out)
        except BaseException:
            turn.release()
            raise
        return BatchReservation(pending, out, todo, turn)

    def commit_batch(
        self, reservation: BatchReservation, drawn: Sequence[Drawn | Exception]
    ) -> list[Charge | Exception]:
        """SelectBatch's step 3: ``drawn`` holds one entry per index of ``reservation.todo``, in
        order (an exception refuses its item alone, nothing spent). One outcome per item, in
        order: a :class:`~recsvc.ledger.charging.Charge` (fresh or replayed) or the exception that
        refused it (nothing spent). Returns only after the COMMIT (fsync) of the charged items."""
        out = list(reservation.outcomes)
        pending = reservation.pending
        for i, d in zip(reservation.todo, drawn, strict=True):
            if isinstance(d, Exception):  # this item's draw failed: refused alone, nothing spent
                out[i] = d
            else:
                pending[i].drawn = d
        queued = [p for i, p in pending.items() if out[i] is None]
        if queued:  # sets each item's result or error (a database that went away: every item's)
            self._group_commit(queued)
        for i, p in pending.items():
            if out[i] is None:
                out[i] = p.error if p.error is not None else p.result
        return [o if o is not None else RuntimeError("no outcome") for o in out]

    def _precheck_batch(self, pending: dict[int, Pending], out: list[Any]) -> list[int]:
        """The batch's pre-check on one read snapshot: fills ``out`` for the items it decides; the
        rest need a draw. A store that cannot be read refuses every item, nothing spent."""
        keys = list({(p.user_id, p.request_id): None for p in pending.values()})
        try:
            stored, accounts = self._snapshot(keys, list({p.user_id: None for p in pending.values()}))
        except LedgerError as exc:
            for i in pending:
                out[i] = exc
            return []
        spent = self._spent_now(accounts)
        for p in pending.values():  # what the commit may check is unchanged (PostgreSQL)
            p.seen = Seen(accounts.get(p.user_id))
        todo: list[int] = []
        earlier: set[tuple[str, str]] = set()
        for i, p in pending.items():
            key = (p.user_id, p.request_id)
            before = spent.get(p.user_id, 0)
            if key in earlier and key not in stored:  # decided at commit against the earlier item; never drawn
                continue
            earlier.add(key)  # so every item that reaches the commit found its request unstored here
            decided = verdict(
                p.user_id, p.request_id, p.fingerprint, p.units, stored.get(key), before, self.budget_units
            )
            if decided is not None:
                out[i] = decided
            else:
                spent[p.user_id] = before + p.units
                todo.append(i)
        return todo
