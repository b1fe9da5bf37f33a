"""The one charging rule every store follows, as pure functions of what the store read.

* :func:`verdict` — a stored answer is replayed (whatever window it was charged in), another
  fingerprint is a conflict, a charge beyond the budget is refused; else: charge it. Before the
  transaction (:func:`precheck`, on a snapshot) and inside it (:func:`decide_all`), the same rule.
* :func:`decide_all` — a transaction's charges in arrival order, each against the state the ones
  before it left, so grouping charges changes throughput, never an outcome.
* :func:`account` — a user's :class:`UserBudget` in the current budget window.

Budgets are exact integers (:mod:`recsvc.ledger.units`) counted per window
(:mod:`recsvc.ledger.window`). Nothing here touches a database, a lock or a clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from recsvc.ledger.errors import BudgetExceeded, LedgerError, RequestConflict
from recsvc.ledger.group_commit import Queued
from recsvc.ledger.units import to_epsilon
from recsvc.ledger.window import BudgetWindow

# One charge as the audit export reads it: user_id, request_id, mechanism, ε units, time (µs since
# the Unix epoch, UTC). Never the fingerprint or the response.
ChargeRow = tuple[str, str, str, int, int]


class Account(NamedTuple):
    """A user's budget row as a store reads it; :class:`AccountWrite` has the same fields, in this order."""

    spent_units: int
    window_start: int
    requests: int


@dataclass(frozen=True, slots=True)
class Drawn:
    """What the caller drew for a reserved request, to store with its charge: the slate of item
    ids in selection order and, when the caller has them, the same items' catalog rows."""

    item_ids: tuple[str, ...]
    item_rows: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """A charged request's answer, as the ledger stores and replays it: typed, never the caller's
    encoding. ``units`` is the exact charge (what budgets and the audit export count);
    ``epsilon`` and ``remaining`` are the doubles the answer reported (the charge and the user's
    budget left right after it), stored as reported so that a replay repeats them bit for bit,
    whichever ledger version wrote the answer."""

    item_ids: tuple[str, ...]
    item_rows: tuple[int, ...]
    mechanism: str
    units: int
    epsilon: float
    remaining: float


# The columns of a stored request's fingerprint and answer, in :meth:`StoredRequest.of`'s order
# (both stores name them alike).
STORED_COLUMNS = "fingerprint, mechanism, epsilon_units, item_ids, item_rows, epsilon_spent, budget_remaining"
N_STORED = len(STORED_COLUMNS.split(", "))


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # json.dumps would build one per call


def ids_text(values: tuple[str, ...] | tuple[int, ...]) -> str:
    """A slate column's text: a JSON array (readable with sqlite3's or PostgreSQL's JSON functions)."""
    return _ENCODE(values)


class StoredRequest(NamedTuple):
    """An answered request as a store reads it: its keyed fingerprint and the stored answer."""

    fingerprint: bytes
    answer: StoredAnswer

    @classmethod
    def of(
        cls, fp: Any, mechanism: Any, units: Any, ids: Any, rows: Any, epsilon: Any, remaining: Any
    ) -> StoredRequest:
        """From the :data:`STORED_COLUMNS` of a row."""
        answer = StoredAnswer(
            tuple(json.loads(ids)),
            tuple(json.loads(rows)),
            str(mechanism),
            int(units),
            float(epsilon),
            float(remaining),
        )
        return cls(bytes(fp), answer)


class AccountWrite(NamedTuple):
    """A user's new budget row (absolute values: the transaction holds the user's lock)."""

    user_id: str
    spent_units: int
    window_start: int
    requests: int


class RequestWrite(NamedTuple):
    """A charged request to store."""

    user_id: str
    request_id: str
    fingerprint: bytes
    answer: StoredAnswer

    def row(self) -> tuple[str, str, bytes, str, int, str, str, float, float]:
        """The values of the stores' :data:`REQUEST_COLUMNS`, in order."""
        a = self.answer
        return (
            self.user_id,
            self.request_id,
            self.fingerprint,
            a.mechanism,
            a.units,
            ids_text(a.item_ids),
            ids_text(a.item_rows),
            a.epsilon,
            a.remaining,
        )


# What both stores insert for a charged request (:meth:`RequestWrite.row`), then ``created``.
REQUEST_COLUMNS = "user_id, request_id, " + STORED_COLUMNS


@dataclass(frozen=True)
class Charge:
    """Outcome of a charge: the stored answer and whether it is a replay (an earlier identical
    request's answer: nothing spent now)."""

    answer: StoredAnswer
    replayed: bool


@dataclass(frozen=True)
class Replay:
    """What :meth:`recsvc.ledger.base.Ledger.reserve` returns for a request already answered:
    the stored answer, to send again; nothing is drawn or spent."""

    answer: StoredAnswer


@dataclass(frozen=True)
class UserBudget:
    """A user's account in exact units, in the current budget window (:mod:`recsvc.ledger.window`:
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


def account(user_id: str, budget_units: int, window: BudgetWindow, row: Account | None, now: float) -> UserBudget:
    """A user's :class:`UserBudget` at time ``now`` from the stored row (None: no charge yet):
    only the current window's charges count."""
    start = window.start(now)
    spent, row_start, n = (0, start, 0) if row is None else row
    in_window, current = window.in_window(spent, row_start, start)
    return UserBudget(
        user_id,
        budget_units,
        in_window,
        n if current == row_start else 0,
        current if window.days else 0,
        window.end(current),
    )


def verdict(
    user_id: str,
    request_id: str,
    fingerprint: bytes,
    units: int,
    prior: StoredRequest | None,
    spent: int,
    budget_units: int,
) -> Charge | LedgerError | None:
    """The one rule, before and inside the transaction: a stored answer is replayed (whatever
    window it was charged in), another fingerprint is a conflict, a charge beyond the budget is
    refused; None: charge it. ``spent`` is the spend in the current budget window
    (:meth:`recsvc.ledger.window.BudgetWindow.in_window`)."""
    if prior is not None:
        return (
            Charge(prior.answer, replayed=True)
            if prior.fingerprint == fingerprint
            else RequestConflict(user_id, request_id)
        )
    if spent + units > budget_units:  # exact: integers
        return BudgetExceeded(user_id, units, spent, budget_units)
    return None


class PrecheckRow(NamedTuple):
    """The pre-check's read of one request and its user (:meth:`recsvc.ledger.base.Ledger.reserve`):
    the stored request (None: not answered yet) and the user's stored account (None: no row)."""

    stored: StoredRequest | None
    account: Account | None


def precheck(p: Pending, row: PrecheckRow, window: BudgetWindow, budget_units: int, now: float) -> Charge | None:
    """The pre-check's verdict from a snapshot read: a stored answer to replay, None to draw and
    charge, or the refusal raised."""
    spent, row_start = (0, 0) if row.account is None else (row.account.spent_units, row.account.window_start)
    in_window = window.in_window(spent, row_start, window.start(now))[0]
    done = verdict(p.user_id, p.request_id, p.fingerprint, p.units, row.stored, in_window, budget_units)
    if isinstance(done, LedgerError):
        raise done
    return done


@dataclass(frozen=True, slots=True)
class Seen:
    """The account a charge's pre-check read (None: the user had no row yet), for PostgreSQL's
    one-statement charge (``PostgresLedger._charge_unchanged``)."""

    account: Account | None


@dataclass(eq=False)
class Pending(Queued):
    """One charge on its way into a store (both stores; ``result`` is its :class:`Charge`)."""

    user_id: str
    request_id: str
    fingerprint: bytes  # keyed (what the ledger stores)
    units: int
    mechanism: str = ""  # the answer's mechanism, stored with it
    # What the caller drew, set before the commit; None: nothing was drawn (a batch item repeating
    # an earlier item's request), so it may only replay that item's answer, never be charged.
    drawn: Drawn | None = None
    built: StoredAnswer | None = None  # what this process stored, to recognise its own commit on a retry (PostgreSQL)
    seen: Seen | None = None  # None: no pre-check read the account


@dataclass
class Writes:
    """What one transaction stores after :func:`decide_all`: the users' new accounts (absolute
    values: the transaction holds their locks) and the charged requests."""

    users: list[AccountWrite]
    requests: list[RequestWrite]


def decide_all(
    batch: list[Pending],
    stored: dict[tuple[str, str], StoredRequest],
    accounts: dict[str, Account],
    window: BudgetWindow,
    budget_units: int,
    now: float,
) -> Writes:
    """Decides every charge of a transaction in order, each by :func:`verdict` against the state
    the ones before it left, and sets its ``result`` or ``error``; returns what to write.

    ``stored`` holds the batch's requests already in the ledger, ``accounts`` each user's
    stored account, both read under the transaction's locks; the whole batch counts in the budget
    window of ``now``. A charge with nothing drawn is refused as a conflict (nothing spent)."""
    start = window.start(now)
    spent: dict[str, int] = {}
    counts: dict[str, int] = {}  # this window's charges per user, the batch's included
    windows: dict[str, int] = {}
    for u, a in accounts.items():
        spent[u], windows[u] = window.in_window(a.spent_units, a.window_start, start)
        counts[u] = a.requests if windows[u] == a.window_start else 0
    stored = dict(stored)
    charged: dict[str, None] = {}
    requests: list[RequestWrite] = []
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
        if p.drawn is None:
            p.error = RequestConflict(p.user_id, p.request_id)
            continue
        after = before + p.units
        answer = StoredAnswer(
            p.drawn.item_ids,
            p.drawn.item_rows,
            p.mechanism,
            p.units,
            to_epsilon(p.units),
            to_epsilon(budget_units - after),
        )
        spent[p.user_id] = after
        counts[p.user_id] = counts.get(p.user_id, 0) + 1
        windows.setdefault(p.user_id, start)
        charged[p.user_id] = None
        stored[key] = StoredRequest(p.fingerprint, answer)
        requests.append(RequestWrite(p.user_id, p.request_id, p.fingerprint, answer))
        p.result, p.built = Charge(answer, replayed=False), answer
    return Writes([AccountWrite(u, spent[u], windows[u], counts[u]) for u in charged], requests)
