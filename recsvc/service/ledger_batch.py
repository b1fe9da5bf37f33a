"""SelectBatch's ledger protocol: :meth:`Ledger.draw_and_charge` for many requests, ONE transaction.

``draw_and_charge_batch(ledger, items, draw, build_response)`` returns one outcome per item, in
order: a :class:`Charge` (fresh or replayed) or the exception that refused it (nothing spent).

1. Each item's ε becomes exact units; an ε the ledger cannot count is that item's
   :class:`InvalidCharge`, decided before the ledger is touched.
2. This process's callers of the same (user_id, request_id) take turns, as for one request
   (keys locked in sorted order, so two batches never wait on each other in a cycle).
3. Pre-check on one read snapshot, holding no lock, items in batch order: a stored answer is
   replayed, another fingerprint is a conflict, a charge beyond what the user has left after
   the EARLIER items of the batch is refused. None of these draws.
4. ``draw(indices)`` draws the samples of the remaining items (a list, one per index) OUTSIDE
   any lock: the caller vectorises it. A sample that is an exception refuses its item alone.
5. One group commit (one transaction, one fsync): every item is decided again by the same rule,
   in batch order, and ``build_response(index, sample, remaining)`` is stored with its spend.

The budget rule in a batch: items are charged in batch order, each against what remains (in the
current budget window, one clock reading for the whole transaction) after the items before it; an item that does not fit is refused (RESOURCE_EXHAUSTED) and a LATER,
smaller item that still fits is charged. An item repeating an earlier item's (user_id,
request_id) within the batch replays that item's answer (or conflicts). Each store implements
the read of step 3 (``_snapshot``) and the transaction of step 5 (``_commit_all``, deciding by
:func:`recsvc.service.ledger_base.decide_all`); the rest is the same for every store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from recsvc.service.ledger_base import Charge, Flights, LedgerError, Pending, RequestConflict, unset, verdict
from recsvc.service.ledger_units import charge_units

if TYPE_CHECKING:
    from recsvc.service.ledger_window import BudgetWindow

S = TypeVar("S")


@dataclass(frozen=True)
class BatchItem:
    """One request of a batch, as the ledger sees it."""

    user_id: str
    request_id: str
    digest: bytes  # SHA-256 of the canonical request (the ledger stores its keyed fingerprint)
    epsilon: float
    mechanism: str = ""  # the answer's mechanism, stored with the charge (``recsvc ledger export``)


class BatchStore(Protocol):
    """What the batch protocol needs of a store (both :class:`recsvc.service.ledger.Ledger` and
    :class:`recsvc.service.ledger_pg.PostgresLedger` have it)."""

    budget_units: int
    _flights: Flights

    def fingerprint(self, digest: bytes) -> bytes: ...

    window: BudgetWindow

    def _clock(self) -> float: ...

    def _snapshot(self, keys: list[tuple[str, str]], users: list[str]) -> tuple[
            dict[tuple[str, str], tuple[bytes, bytes]], dict[str, tuple[int, int, int]]]: ...

    def _commit_all(self, items: list[Pending]) -> None: ...


def draw_and_charge_batch(ledger: BatchStore, items: Sequence[BatchItem], draw: Callable[[list[int]], list[S]],
                          build_response: Callable[[int, S, float], bytes]) -> list[Charge | Exception]:
    """See the module docstring. Returns only after the COMMIT (fsync) of the charged items."""
    out: list[Charge | Exception | None] = [None] * len(items)
    pending: dict[int, Pending] = {}
    for i, it in enumerate(items):
        try:
            pending[i] = Pending(it.user_id, it.request_id, ledger.fingerprint(it.digest), charge_units(it.epsilon),
                                 unset, it.mechanism)
        except ValueError as exc:  # InvalidCharge: this item alone
            out[i] = exc
    with ExitStack() as turns:
        for key in sorted({(p.user_id, p.request_id) for p in pending.values()}):
            turns.enter_context(ledger._flights.one_at_a_time(key))
        todo = _precheck(ledger, pending, out)
        samples = draw(todo) if todo else []
        for i, sample in zip(todo, samples, strict=True):
            if isinstance(sample, Exception):  # this item's draw failed: refused alone, nothing spent
                out[i] = sample
                continue
            pending[i].build_response = (lambda i, s: lambda remaining: build_response(i, s, remaining))(i, sample)
        queued = [p for i, p in pending.items() if out[i] is None]
        if queued:  # sets each item's result or error (a database that went away: every item's)
            ledger._commit_all(queued)
        for i, p in pending.items():
            if out[i] is None:
                out[i] = p.error if p.error is not None else p.result
    return [o if o is not None else RuntimeError("no outcome") for o in out]


def _precheck(ledger: BatchStore, pending: dict[int, Pending], out: list) -> list[int]:
    """Step 3 on one read snapshot: fills ``out`` for the items it decides; the rest need a draw.
    A store that cannot be read (:class:`LedgerUnavailable`) refuses every item, nothing spent."""
    keys = list({(p.user_id, p.request_id): None for p in pending.values()})
    try:
        stored, accounts = ledger._snapshot(keys, list({p.user_id: None for p in pending.values()}))
    except LedgerError as exc:
        for i in pending:
            out[i] = exc
        return []
    spent = ledger.window.spent_now(((u, s, ws) for u, (s, ws, _n) in accounts.items()), ledger._clock())
    for p in pending.values():
        p.seen = accounts.get(p.user_id)  # what the commit may check is unchanged (PostgreSQL)
    todo: list[int] = []
    earlier: set[tuple[str, str]] = set()
    for i, p in pending.items():
        key = (p.user_id, p.request_id)
        before = spent.get(p.user_id, 0)
        if key in earlier and key not in stored:  # decided at commit against the earlier item; never draws
            p.build_response = _refuse_duplicate(p)
            continue
        earlier.add(key)  # so every item that reaches the commit found its request unstored here
        decided = verdict(p.user_id, p.request_id, p.fingerprint, p.units, stored.get(key), before, ledger.budget_units)
        if decided is not None:
            out[i] = decided
        else:
            spent[p.user_id] = before + p.units
            todo.append(i)
    return todo


def _refuse_duplicate(p: Pending) -> Callable[[float], bytes]:
    """A repeated (user_id, request_id) is charged only as a replay of the earlier item's answer."""
    def refuse(_remaining: float) -> bytes:
        raise RequestConflict(p.user_id, p.request_id)

    return refuse
