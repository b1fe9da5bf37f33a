"""The concurrency under every store's charges: group commit and one caller per request at a time.

Nothing here knows about budgets or databases: :class:`GroupCommit` batches whatever items its
callers queue into one call of the store's transaction, and :class:`Flights` serialises the
callers of one key. :class:`recsvc.ledger.base.Ledger` builds the draw-then-commit protocol on them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class _Flight:
    """One key's turn: its lock and the callers inside or waiting for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    callers: int = 0


class Flights:
    """Serialises the callers of one (user_id, request_id) in this process, so concurrent
    duplicates draw once: the later ones find the stored answer."""

    def __init__(self) -> None:
        self._flights: dict[tuple[str, str], _Flight] = {}
        self._lock = threading.Lock()

    def waiting(self, key: tuple[str, str]) -> int:
        """Callers of ``key`` holding or waiting for its turn (:meth:`take`; for tests)."""
        with self._lock:
            flight = self._flights.get(key)
            return 0 if flight is None else flight.callers

    def take(self, keys: Iterable[tuple[str, str]]) -> Turns:
        """The turns of ``keys``, taken in the order given (callers that take several sort them,
        so two never wait on each other in a cycle); released by :meth:`Turns.release`. A key
        given twice is taken once."""
        turns = Turns(self)
        for key in keys:
            if key in turns.held:
                continue
            with self._lock:
                flight = self._flights.setdefault(key, _Flight())
                flight.callers += 1
            try:
                flight.lock.acquire()
            except BaseException:  # interrupted while waiting: not held, no longer waiting
                self._leave(key, flight)
                turns.release()
                raise
            turns.held[key] = flight
        return turns

    def _leave(self, key: tuple[str, str], flight: _Flight) -> None:
        with self._lock:
            flight.callers -= 1
            if flight.callers == 0:
                del self._flights[key]


class Turns:
    """The per-key turns one caller holds (:meth:`Flights.take`); :meth:`release` ends them,
    once, however often it is called."""

    __slots__ = ("_flights", "held")

    def __init__(self, flights: Flights) -> None:
        self._flights = flights
        self.held: dict[tuple[str, str], _Flight] = {}

    def release(self) -> None:
        held, self.held = self.held, {}
        for key, flight in held.items():
            flight.lock.release()
            self._flights._leave(key, flight)


class GroupCommit:
    """Group commit: concurrent callers queue; while one leader commits, the others wait; the
    next leader commits every queued charge in ONE transaction (one WAL flush), each charge
    checked in arrival order against the state left by the ones before it (:func:`recsvc.ledger.charging.decide_all`),
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
        self._since: float | None = None  # time.monotonic() when the running commit started

    def running_for(self) -> float:
        """Seconds the running commit has taken so far (0: none runs): for health, a commit that
        runs much longer than a charge ever should is a stuck pipeline."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

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
        self._since = time.monotonic()
        try:
            self._commit(take)
        finally:
            self._since = None
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


@dataclass(eq=False, kw_only=True)
class Queued:
    """What :class:`GroupCommit` needs of an item: its outcome, set by the leader that took it."""

    result: Any = None
    error: Exception | None = None
    finished: bool = False  # set by the group-commit leader once its batch committed or failed
    # Held until a leader releases it (see GroupCommit); a bare lock is the cheapest wake-up.
    wake: threading.Lock = field(default_factory=_locked)
