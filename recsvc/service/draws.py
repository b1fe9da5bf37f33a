"""Heavy draws yield the CPU: random stopping at a tiny γ must not slow other users down.

Random stopping makes ≈ 1/γ base draws per selection; at the `gamma` ParamSpec floor (1e-6,
the bound on any single draw's expected cost) that is ≈ 10⁶ draws, tens of milliseconds of CPU
and ≈ 16 MB, with a geometric tail (P(K > t/γ) ≈ e^-t). Such draws already run outside the
ledger's lock (:meth:`recsvc.ledger.Ledger.draw_and_charge`); on top of that, a sample
expected to need more than ``heavy_draws`` draws runs in a small pool of ``heavy_draw_threads``
threads at the lowest CPU priority (nice 19, per thread on Linux). Every other request's thread
then wins the CPU against them, the pool bounds how many such draws (and their memory) run at
once, and the idle CPU still goes to them. Both numbers are :class:`recsvc.service.config.Policy`
knobs (``serve --heavy-draws``, ``--heavy-draw-threads``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from recsvc.mechanisms import MECHANISMS

T = TypeVar("T")


def expected_draws(mechanism: str, n: int, params: Mapping[str, float | None]) -> float:
    """Random draws a sample is expected to need: one per candidate, or ≈ 1/γ for random stopping
    (the mean of rs's geometric K; rs_improved's logarithmic K has a smaller mean)."""
    spec = MECHANISMS[mechanism].params.get("gamma")
    if spec is None:
        return float(n)
    gamma = params.get("gamma")
    return max(float(n), 1.0 / (spec.default if gamma is None else gamma))


def _lowest_priority() -> None:
    """Initializer of the pool's threads: nice 19 for the calling thread only (on Linux a priority
    is per thread); elsewhere the pool still bounds how many heavy draws run at once."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class HeavyDraws:
    """Runs a draw inline, or, if it is expected to be heavy, in the low-priority pool."""

    def __init__(self, heavy_draws: int, threads: int) -> None:
        self.heavy_draws, self.threads = heavy_draws, threads
        self._pool: ThreadPoolExecutor | None = None  # made on first use, in the serving process
        self._lock = threading.Lock()
        self.pooled = 0  # draws run by the pool (tests, metrics)

    def run(self, draw: Callable[[], T], expected: float) -> T:
        if expected <= self.heavy_draws:
            return draw()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, "recsvc-heavy-draw", initializer=_lowest_priority)
            self.pooled += 1
        return self._pool.submit(draw).result()  # waits without the GIL
