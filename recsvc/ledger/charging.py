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

from collections.abc import Callable
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
    """A user's budget row as a store reads it."""

    spent_units: int
    window_start: int
    requests: int


class StoredRequest(NamedTuple):
    """An answered request as a store reads it: its keyed fingerprint and the stored answer."""

    fingerprint: bytes
    response: bytes


class AccountWrite(NamedTuple):
    """A user's new budget row, in the stores' column order (absolute values: the transaction
    holds the user's lock)."""

    user_id: str
    spent_units: int
    requests: int
    window_start: int


class RequestWrite(NamedTuple):
    """A charged request to store, in the stores' column order."""

    user_id: str
    request_id: str
    fingerprint: bytes
    units: int
    response: bytes
    mechanism: str


@dataclass(frozen=True)
class Charge:
    """Outcome of a charge: the stored response bytes and whether it is a replay."""

    response: bytes
    replayed: bool


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
            Charge(prior.response, replayed=True)
            if prior.fingerprint == fingerprint
            else RequestConflict(user_id, request_id)
        )
    if spent + units > budget_units:  # exact: integers
        return BudgetExceeded(user_id, units, spent, budget_units)
    return None


def precheck(
    p: Pending, row: tuple[Any, Any, Any, Any], window: BudgetWindow, budget_units: int, now: float
) -> Charge | None:
    """The pre-check's verdict (:meth:`recsvc.ledger.base.Ledger.draw_and_charge`) from a
    snapshot row ``(stored fingerprint, stored response, spent_units, window_start)``, NULLs where
    nothing is stored: a stored answer to replay, None to draw and charge, or the refusal raised."""
    fp, response, spent, row_start = row
    prior = None if fp is None else StoredRequest(bytes(fp), bytes(response))
    in_window = window.in_window(int(spent or 0), int(row_start or 0), window.start(now))[0]
    done = verdict(p.user_id, p.request_id, p.fingerprint, p.units, prior, in_window, budget_units)
    if isinstance(done, LedgerError):
        raise done
    return done


def unset(_remaining: float) -> bytes:
    raise RuntimeError("no response builder set")


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
    # Whether the pre-check read the user's account, and what it read (None: no row yet), for
    # PostgreSQL's one-statement charge (``PostgresLedger._charge_unchanged``).
    read: bool = False
    seen: Account | None = None


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
    stored account, both read under the
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
        after = before + p.units
        try:
            response = p.build_response(to_epsilon(budget_units - after))
        except Exception as exc:  # this charge alone is refused, nothing spent
            p.error = exc
            continue
        spent[p.user_id] = after
        counts[p.user_id] = counts.get(p.user_id, 0) + 1
        windows.setdefault(p.user_id, start)
        charged[p.user_id] = None
        stored[key] = StoredRequest(p.fingerprint, response)
        requests.append(RequestWrite(p.user_id, p.request_id, p.fingerprint, p.units, response, p.mechanism))
        p.result, p.built = Charge(response, replayed=False), response
    return Writes([AccountWrite(u, spent[u], counts[u], windows[u]) for u in charged], requests)
