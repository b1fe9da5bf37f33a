"""What every privacy-ledger store shares: the interface the service depends on, its results and
refusals, the one charging rule, and how a ``--ledger`` value picks a store.

Two stores implement :class:`LedgerStore`: :class:`recsvc.service.ledger.Ledger` (embedded SQLite,
the default) and :class:`recsvc.service.ledger_pg.PostgresLedger` (a PostgreSQL database shared
by several replicas). Both count ε in exact 10⁻¹² units, store only keyed fingerprints, draw
the sample outside any lock, and store the answer in the same transaction as its spend.
tests/ledger_conformance.py runs the same tests against both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from recsvc.service.ledger_units import format_units, to_epsilon

if TYPE_CHECKING:
    from recsvc.service.ledger_window import BudgetWindow

S = TypeVar("S")

URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(ledger: object) -> bool:
    """True when ``--ledger`` is a libpq URL (postgresql://user@host:port/db), not an SQLite path."""
    return isinstance(ledger, str) and ledger.startswith(URL_SCHEMES)


class LedgerError(Exception):
    """Base class of the ledger's refusals (nothing was spent)."""


class LedgerUnavailable(LedgerError):
    """The ledger's database cannot be reached (gRPC UNAVAILABLE). A charge whose COMMIT was not
    confirmed may or may not have been stored: a retry with the same request_id finds out."""


class BudgetExceeded(LedgerError):
    def __init__(self, user_id: str, units: int, spent_units: int, budget_units: int) -> None:
        self.user_id, self.units, self.spent_units, self.budget_units = user_id, units, spent_units, budget_units
        super().__init__(
            f"privacy budget exhausted for user {user_id!r}: requested epsilon={format_units(units)} but only "
            f"{format_units(max(budget_units - spent_units, 0))} of {format_units(budget_units)} remains; "
            "nothing was spent"
        )


class RequestConflict(LedgerError):
    def __init__(self, user_id: str, request_id: str) -> None:
        super().__init__(
            f"request_id {request_id!r} was already used for user {user_id!r} with different "
            "parameters; a retry must repeat the request exactly, a new request needs a new request_id"
        )


@dataclass(frozen=True)
class Charge:
    """Outcome of a charge: the stored response bytes and whether it is a replay."""

    response: bytes
    replayed: bool


@dataclass(frozen=True)
class UserBudget:
    """A user's account in exact units, in the current budget window (:mod:`recsvc.service.ledger_window`:
    ``spent_units`` and ``requests`` count this window's charges; lifetime: all of them, and the
    window bounds are 0); the float properties are for display (and the wire)."""

    user_id: str
    budget_units: int
    spent_units: int
    requests: int
    window_start: int = 0  # Unix seconds, UTC; 0: lifetime
    window_end: int = 0  # Unix seconds (exclusive); 0: lifetime (never ends)

    @property
    def budget(self) -> float:
        return to_epsilon(self.budget_units)

    @property
    def spent(self) -> float:
        return to_epsilon(self.spent_units)

    @property
    def remaining(self) -> float:
        return to_epsilon(max(self.budget_units - self.spent_units, 0))


def account(user_id: str, budget_units: int, window: BudgetWindow, row: tuple[int, int, int] | None,
            now: float) -> UserBudget:
    """A user's :class:`UserBudget` at time ``now`` from the stored row ``(spent_units,
    window_start, requests)`` (None: no charge yet): only the current window's charges count."""
    start = window.start(now)
    spent, row_start, n = (0, start, 0) if row is None else row
    in_window, current = window.in_window(spent, row_start, start)
    return UserBudget(user_id, budget_units, in_window, n if current == row_start else 0,
                      current if window.days else 0, window.end(current))


class LedgerStore(Protocol):
    """The ledger as the service sees it (see :meth:`recsvc.service.ledger.Ledger.draw_and_charge`
    for the protocol every store follows)."""

    budget: float
    budget_units: int
    key_created: bool

    def draw_and_charge(self, user_id: str, request_id: str, digest: bytes, epsilon: float,
                        draw: Callable[[], S], build_response: Callable[[S, float], bytes], *,
                        mechanism: str = "") -> Charge: ...

    def charge(self, user_id: str, request_id: str, digest: bytes, epsilon: float,
               build_response: Callable[[float], bytes], *, mechanism: str = "") -> Charge: ...

    def user(self, user_id: str) -> UserBudget: ...

    def lookup(self, user_id: str, request_id: str) -> tuple[bytes, bytes] | None: ...

    def totals(self) -> dict[str, float]: ...

    def fingerprint(self, digest: bytes) -> bytes: ...

    def reachable(self) -> bool: ...

    def close(self) -> None: ...


def verdict(user_id: str, request_id: str, fingerprint: bytes, units: int, prior: tuple[bytes, bytes] | None,
            spent: int, budget_units: int) -> Charge | LedgerError | None:
    """The one rule, before and inside the transaction: a stored answer is replayed (whatever
    window it was charged in), another fingerprint is a conflict, a charge beyond the budget is
    refused; None: charge it. ``spent`` is the spend in the current budget window
    (:meth:`recsvc.service.ledger_window.BudgetWindow.in_window`)."""
    if prior is not None:
        return Charge(prior[1], replayed=True) if prior[0] == fingerprint else RequestConflict(user_id, request_id)
    if spent + units > budget_units:  # exact: integers
        return BudgetExceeded(user_id, units, spent, budget_units)
    return None


def precheck(p: Pending, row: tuple[Any, Any, Any, Any], window: BudgetWindow, budget_units: int,
             now: float) -> Charge | None:
    """The pre-check's verdict (:func:`draw_then_commit`) from a snapshot row ``(stored
    fingerprint, stored response, spent_units, window_start)``, NULLs where nothing is stored: a
    stored answer to replay, None to draw and charge, or the refusal raised."""
    fp, response, spent, row_start = row
    prior = None if fp is None else (bytes(fp), bytes(response))
    in_window = window.in_window(int(spent or 0), int(row_start or 0), window.start(now))[0]
    done = verdict(p.user_id, p.request_id, p.fingerprint, p.units, prior, in_window, budget_units)
    if isinstance(done, LedgerError):
        raise done
    return done


class Flights:
    """Serialises the callers of one (user_id, request_id) in this process, so concurrent
    duplicates draw once: the later ones find the stored answer."""

    def __init__(self) -> None:
        self._flights: dict[tuple[str, str], list] = {}
        self._lock = threading.Lock()

    def waiting(self, key: tuple[str, str]) -> int:
        """Callers of ``key`` inside or queued for :meth:`one_at_a_time` (for tests)."""
        with self._lock:
            return self._flights.get(key, [None, 0])[1]

    @contextmanager
    def one_at_a_time(self, key: tuple[str, str]) -> Iterator[None]:
        with self._lock:
            entry = self._flights.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._flights[key]


def draw_then_commit(store: Any, p: Any, draw: Callable[[], S], build_response: Callable[[S, float], bytes]) -> Charge:
    """Steps 2–5 of ``draw_and_charge``, the same for every store: one caller per (user_id,
    request_id) at a time; ``store._precheck(p)`` on a snapshot (a replay, or a raised refusal,
    draws nothing); ``draw()`` holding no lock; ``store._commit(p)`` decides again and stores."""
    with store._flights.one_at_a_time((p.user_id, p.request_id)):
        done = store._precheck(p)
        if done is not None:
            return done
        sample = draw()
        p.build_response = lambda remaining: build_response(sample, remaining)
        return store._commit(p)


class GroupCommit:
    """Group commit: concurrent callers queue; while one leader commits, the others wait; the
    next leader commits every queued charge in ONE transaction (one WAL flush), each charge
    checked in arrival order against the state left by the ones before it (:func:`decide_all`),
    so batching changes throughput, never the outcome. Several items of one call (a SelectBatch)
    are queued together, so one transaction commits them all.

    ``commit(take)`` is the store's transaction: it calls ``take()`` once it is ready (holds its
    locks, has a connection) to get the batch, and sets every taken item's ``result``/``error``.
    Every waiter sleeps on its OWN lock until the leader either finished its charge or handed it
    the lead, so a commit wakes exactly the threads that have something to do."""

    def __init__(self, commit: Callable[[Callable[[], list[Any]]], None]) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._queue: list[Queued] = []
        self._leading = False

    def queued(self) -> int:
        """Charges waiting for a leader to take them (for tests)."""
        with self._lock:
            return len(self._queue)

    def __call__(self, items: list[Any]) -> None:
        item = items[0]  # the one this caller waits on
        with self._lock:  # contiguous in the queue, so one leader takes them all
            self._queue.extend(items)
            lead = not self._leading
            self._leading = True
        if not lead:
            item.wake.acquire()  # released by a leader: our charges are finished, or we lead next
            lead = not item.finished
        if lead:
            self._lead(items)

    def _lead(self, items: list[Queued]) -> None:
        taken: list[Queued] | None = None

        def take() -> list[Queued]:
            nonlocal taken
            with self._lock:
                taken, self._queue = self._queue, []
            return taken

        successor: Queued | None = None
        try:
            self._commit(take)
        finally:
            for other in taken or ():
                other.finished = True
            with self._lock:
                if taken is None:  # failed before taking the queue: withdraw our charges
                    for own in items:
                        self._queue.remove(own)
                if self._queue:  # hand the lead to the oldest waiter (it stays "leading")
                    successor = self._queue[0]
                else:
                    self._leading = False
            if successor is not None:  # first, so its commit overlaps the wake-ups below
                successor.wake.release()
            for other in taken or ():
                if other is not items[0]:
                    other.wake.release()

    def one(self, item: Queued) -> Any:
        """Commits one item: its result, or its error raised."""
        self([item])
        if item.error is not None:
            raise item.error
        return item.result


def _locked() -> threading.Lock:
    (lock := threading.Lock()).acquire()
    return lock


def unset(_remaining: float) -> bytes:
    raise RuntimeError("no response builder set")


@dataclass(eq=False, kw_only=True)
class Queued:
    """What :class:`GroupCommit` needs of an item: its outcome, set by the leader that took it."""

    result: Any = None
    error: Exception | None = None
    finished: bool = False  # set by the group-commit leader once its batch committed or failed
    # Held until a leader releases it (see GroupCommit); a bare lock is the cheapest wake-up.
    wake: threading.Lock = field(default_factory=_locked)


@dataclass(eq=False)
class Pending(Queued):
    """One charge on its way into a store (both stores; ``result`` is its :class:`Charge`, the
    PostgreSQL store also uses ``built`` and ``seen``)."""

    user_id: str
    request_id: str
    fingerprint: bytes  # keyed (what the ledger stores)
    units: int
    build_response: Callable[[float], bytes]
    mechanism: str = ""  # the answer's mechanism, stored for the audit export
    built: bytes | None = None  # what this process stored, to recognise its own commit on a retry (PostgreSQL)
    # The account (spent_units, window_start, requests) the pre-check read, None: no row yet,
    # False: not read (PostgreSQL's one-statement charge, ``PostgresLedger._charge_unchanged``).
    seen: tuple[int, int, int] | None | bool = False


@dataclass
class Writes:
    """What one transaction stores after :func:`decide_all`: the users' new accounts (absolute
    values: the transaction holds their locks) and the charged requests."""

    users: list[tuple[str, int, int, int]]  # (user_id, spent_units, requests, window_start)
    requests: list[tuple[str, str, bytes, int, bytes, str]]  # (user_id, request_id, fingerprint, units, response, mechanism)


def decide_all(batch: list[Pending], stored: dict[tuple[str, str], tuple[bytes, bytes]],
               accounts: dict[str, tuple[int, int, int]], window: BudgetWindow, budget_units: int,
               now: float) -> Writes:
    """Decides every charge of a transaction in order, each by :func:`verdict` against the state
    the ones before it left, and sets its ``result`` or ``error``; returns what to write.

    ``stored`` holds the (fingerprint, response) of the batch's requests already in the ledger,
    ``accounts`` each user's stored (spent_units, window_start, requests), both read under the
    transaction's locks; the whole batch counts in the budget window of ``now``. A response
    builder that raises refuses its charge alone (nothing spent)."""
    start = window.start(now)
    spent: dict[str, int] = {}
    counts: dict[str, int] = {}  # this window's charges per user, the batch's included
    windows: dict[str, int] = {}
    for u, (s, ws, n) in accounts.items():
        spent[u], windows[u] = window.in_window(s, ws, start)
        counts[u] = n if windows[u] == ws else 0
    stored = dict(stored)
    charged: dict[str, None] = {}
    requests: list[tuple[str, str, bytes, int, bytes, str]] = []
    for p in batch:
        p.result, p.error = None, None  # a retried transaction decides afresh
        key = (p.user_id, p.request_id)
        before = spent.get(p.user_id, 0)
        decided = verdict(p.user_id, p.request_id, p.fingerprint, p.units, stored.get(key), before, budget_units)
        if isinstance(decided, Charge):
            p.result = decided
            continue
        if decided is not None:
            p.error = decided
            continue
        after = before + p.units
        try:
            response = p.build_response(to_epsilon(budget_units - after))
        except Exception as exc:  # noqa: BLE001 - this charge alone is refused, nothing spent
            p.error = exc
            continue
        spent[p.user_id] = after
        counts[p.user_id] = counts.get(p.user_id, 0) + 1
        windows.setdefault(p.user_id, start)
        charged[p.user_id] = None
        stored[key] = (p.fingerprint, response)
        requests.append((p.user_id, p.request_id, p.fingerprint, p.units, response, p.mechanism))
        p.result, p.built = Charge(response, replayed=False), response
    return Writes([(u, spent[u], counts[u], windows[u]) for u in charged], requests)
