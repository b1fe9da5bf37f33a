"""Heavy work never holds a request thread, and never slows other users down.

Random stopping makes ≈ 1/γ base draws per selection; at the `gamma` ParamSpec floor (1e-6,
the bound on any single draw's expected cost) that is ≈ 10⁶ draws, tens of milliseconds of CPU
and ≈ 16 MB, with a geometric tail (P(K > t/γ) ≈ e^-t); a two-stage Recommend's private top-m
peels m times over the catalog. :attr:`recsvc.service.requests.Prepared.work` counts every stage.

Every PrivateSelection call is **priced** before it runs: its request, decoded and validated once,
comes with a :class:`Price` read off public quantities only (sizes, k, γ, the mechanism: never the
scores), and the gate chooses the pool that runs it from that price (decision 0005). A call whose
work is expected to need more than ``heavy_draws`` draws runs in :class:`HeavyCalls`, a bounded
queue (``heavy_queue`` calls in all, ``heavy_per_principal`` per principal; beyond either,
RESOURCE_EXHAUSTED before anything is drawn or spent), so it holds no request thread. A heavy
call's thread runs the usual draw-then-charge path at normal priority; its draw alone goes to
:class:`HeavyDraws`, ``heavy_draw_threads`` processes at the lowest CPU priority (nice 19).
Processes, not threads: a draw thread holds the GIL between numpy's calls, so at nice 19 on a busy
host it would stall every other thread of the server (docs/decisions/0005-asynchronous-server.md).
A pool whose process dies is replaced; the call whose draw it interrupted is UNAVAILABLE with
nothing spent. The knobs are :class:`recsvc.service.config.SelectionSettings` fields (``serve
--heavy-draws``, ``--heavy-draw-threads``, ``--heavy-queue``, ``--heavy-per-principal``).

At the other end, **light** work (:func:`light`, :attr:`Price.light`) may run on the event loop
itself when its call is alone on the server (the gate decides; decision 0005): a draw whose length
is set by the candidates alone, never by a request parameter, and small.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from recsvc.mechanisms import ValidSlate, ValidTwoStage
from recsvc.service.errors import Interrupted, Overloaded, PermissionDenied
from recsvc.service.requests import Prepared, draw_valid, parameter_driven
from recsvc.service.shutdown import exit_with_parent
from recsvc.service.threads import Threads

if TYPE_CHECKING:  # the selection layer imports this module without grpc, which auth needs
    from recsvc.service.auth import Caller

T = TypeVar("T")
Q = TypeVar("Q")  # a decoded request message
P = TypeVar("P")  # the request validated, ready to run
R = TypeVar("R")  # the response message


def _draw_process(parent: int) -> None:
    """Initializer of the draw processes: nice 19 (the whole process: it shares no GIL), and ended
    soon after the server ``parent`` is, even by SIGKILL (nothing in it needs a clean exit)."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(19)
    exit_with_parent(parent, signal.SIGKILL)


def _draw_in_pool(v: ValidSlate | ValidTwoStage) -> np.ndarray:
    """A draw process's job: the sample, from the process's own CSPRNG (keyed in that process)."""
    from recsvc.rng import thread_csprng

    return draw_valid(v, thread_csprng())


class HeavyDraws:
    """Draws a sample inline, or, if it is expected to be heavy, in the low-priority processes."""

    def __init__(self, heavy_draws: int, processes: int) -> None:
        self.heavy_draws, self.processes = heavy_draws, processes
        self._pool: ProcessPoolExecutor | None = None  # made on first use, in the serving process
        self._lock = threading.Lock()
        self.pooled = 0  # draws made by the pool (tests)

    def draw(self, p: Prepared, inline: Callable[[], np.ndarray]) -> np.ndarray:
        """``p``'s sample: ``inline()`` in this thread, or, when ``p`` is heavy, made by a draw
        process from its own CSPRNG (only what the draw needs crosses, ``p.valid``: no ids, no
        fingerprint)."""
        if p.work <= self.heavy_draws:
            return inline()
        with self._lock:
            self.pooled += 1
        pool = self._current()
        try:
            future = pool.submit(_draw_in_pool, p.valid)
        except BrokenProcessPool:  # its process died before this draw began: a new pool draws it
            pool = self._renewed(pool)
            future = pool.submit(_draw_in_pool, p.valid)
        try:
            return future.result()  # a heavy call's thread waits
        except BrokenProcessPool:  # it died during this draw: no sample reached the caller
            self._renewed(pool)
            raise Interrupted(
                "the server's draw process ended during this call's draw; nothing was drawn or spent, "
                "retry with the same request_id"
            ) from None

    def _current(self) -> ProcessPoolExecutor:
        """The draw pool, made on first use in the serving process."""
        with self._lock:
            if self._pool is None:
                # spawn: a forked child would inherit this process's gRPC threads and CSPRNG state
                self._pool = ProcessPoolExecutor(
                    self.processes,
                    multiprocessing.get_context("spawn"),
                    initializer=_draw_process,
                    initargs=(os.getpid(),),
                )
            return self._pool

    def _renewed(self, dead: ProcessPoolExecutor) -> ProcessPoolExecutor:
        """A pool in place of ``dead`` (once, however many calls saw it break)."""
        with self._lock:
            if self._pool is dead:
                self._pool = None
        dead.shutdown(wait=False, cancel_futures=True)
        return self._current()

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


# Draws a call may make on the event loop: n = 4,096 takes rnm 86 µs, gem 180 µs, combined_gem 340 µs.
LIGHT_DRAWS = 4096


def light(p: Prepared) -> bool:
    """Whether ``p``'s draw may run on the event loop: at most :data:`LIGHT_DRAWS` draws, a
    single-stage selection, and a length no request parameter sets (random stopping's γ does, with
    a geometric tail, so no bound on one call's time would hold)."""
    return p.stage is None and p.work <= LIGHT_DRAWS and not parameter_driven(p.mechanism)


@dataclass(frozen=True)
class Price:
    """What a call is expected to cost, from public quantities only (the request's sizes, k, γ and
    mechanism; never its scores), so where it runs reveals nothing about a user's data."""

    draws: float = 0.0  # random draws its work is expected to make (Prepared.work, summed over a batch)
    light: bool = False  # it may run on the event loop when alone (:func:`light`)


def price_of(p: Prepared) -> Price:
    return Price(p.work, light(p))


@dataclass(frozen=True)
class Priced(Generic[P]):
    """A decoded request validated once (``value``: a Prepared, or what the method needs), with
    its :class:`Price`; nothing is drawn or spent yet."""

    value: P
    price: Price = Price()


@dataclass(frozen=True)
class UseCase(Generic[Q, P, R]):
    """One RPC, as the gate runs it: ``prepare(caller, request)`` authorizes the request for the
    authenticated ``caller``, checks everything (a refusal raises) and prices the call, touching no
    ledger; ``run(value)`` reserves, draws, commits and returns the response message, in the pool
    the price chose."""

    prepare: Callable[[Caller, Q], Priced[P]]
    run: Callable[[P], R]

    def __call__(self, request: Q, context: Any) -> R:
        """As a plain gRPC behaviour (a server without the gate) there is no authenticated caller:
        refuse rather than trust."""
        raise PermissionDenied("no authenticated caller: the server's gate is not installed")


class HeavyCalls:
    """The bounded queue of heavy calls (module docstring): those whose price is above
    ``heavy_draws`` draws. Admission and release run on the event loop's thread only, so the counts
    need no lock."""

    def __init__(self, queue: int, per_principal: int, heavy_draws: int) -> None:
        self.queue, self.per_principal, self.heavy_draws = queue, per_principal, heavy_draws
        self._threads = Threads(queue, "recsvc-heavy-call")  # one thread per admitted call
        self._held: Counter[str] = Counter()
        self.held = 0

    def takes(self, price: Price) -> bool:
        """Whether a call of this price runs here rather than in a request thread."""
        return price.draws > self.heavy_draws

    async def run(self, key: str, work: Callable[[], T]) -> T:
        """``work()`` in a heavy call's thread, with this task's context (the caller);
        Overloaded, before anything runs, when the queue or ``key``'s share of it is full."""
        if self.held >= self.queue:
            raise Overloaded(f"{self.queue} heavy calls are already queued on this worker (--heavy-queue); retry later")
        if self._held[key] >= self.per_principal:
            raise Overloaded(
                f"this principal already has {self.per_principal} heavy calls queued (--heavy-per-principal); "
                "retry when one is answered"
            )
        self.held += 1
        self._held[key] += 1
        # Released when the work ends, not when the caller stops waiting: the slot bounds threads and memory.
        return await self._threads.run(work, lambda: self._release(key))

    def _release(self, key: str) -> None:
        self.held -= 1
        self._held[key] -= 1
        if not self._held[key]:
            del self._held[key]

    def shutdown(self) -> None:
        self._threads.shutdown()
