"""What one worker's calls in flight may hold, counted by the gate (SECURITY.md, "Admission";
decision 0006).

The server is asynchronous (``grpc.aio``): a call that has sent its headers but not its message
costs a coroutine, never a thread, so idle, header-only and slow-body streams pin nothing. On
top of that every resource a call can hold is bounded, and a call beyond a bound is refused
with RESOURCE_EXHAUSTED before its message is read or decoded:

- **HTTP/2** (gRPC's own limits, :func:`channel_options`): streams per connection, how long an
  idle connection stays open, keepalive pings both ways and the message size;
- **authenticated unary calls in flight** (:attr:`Admission.rpcs`), taken after authentication so
  anonymous traffic never holds one;
- **request bytes in flight** (:attr:`Admission.bytes`), taken when a message has arrived and
  before it is decoded (decoding multiplies its size), released when the call ends;
- **streaming calls** in pools of their own, so that a stream, which lives as long as its client
  wants, never holds a unary call's slot: health watchers (:attr:`Admission.watches`; Check is
  answered without a bound) and the authenticated streaming calls, server reflection
  (:attr:`Admission.streams`);
- **the receive deadline**: a unary call's message must arrive within ``receive_timeout`` of its
  headers, and a stream must pass a message within ``stream_idle_timeout``.

Each pool is :class:`Shares`: one principal (:attr:`recsvc.service.auth.Caller.key`; anonymous
callers: one per peer address) holds at most ``principal_share`` of it, so no single credential
can take a pool that other principals need.

The counters are touched only on the event loop's thread, so they need no lock.
"""

from __future__ import annotations

import asyncio
import enum
import math
import threading
import time

from recsvc.service.config import Admission as Settings
from recsvc.service.config import ServerConfig


class Full(enum.Enum):
    """Which bound of a :class:`Shares` a take would pass."""

    TOTAL = "total"
    PRINCIPAL = "principal"


class Shares:
    """``limit`` units, of which one key (a principal) holds at most ``fraction`` of the limit.
    A key that holds nothing may take any amount within the limit: its first call is admitted
    whenever the pool has room, however small its share rounds to (event-loop thread only)."""

    def __init__(self, limit: int, fraction: float) -> None:
        self.limit, self.held = limit, 0
        self.fraction = fraction
        self.share = int(limit * fraction)
        self._by_key: dict[str, int] = {}

    def take_for(self, key: str, n: int = 1) -> Full | None:
        """Takes ``n`` units for ``key``; None, or the bound that refused them (nothing taken)."""
        if not n:
            return None  # an empty message holds nothing, and leaves no key behind
        mine = self._by_key.get(key, 0)
        if mine and mine + n > self.share:
            return Full.PRINCIPAL
        if not self.take(n):
            return Full.TOTAL
        self._by_key[key] = mine + n
        return None

    def take(self, n: int = 1) -> bool:
        """Takes ``n`` units for no key, if the limit allows."""
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give_for(self, key: str, n: int = 1) -> None:
        self.held -= n
        left = self._by_key[key] - n
        if left:
            self._by_key[key] = left
        else:
            del self._by_key[key]  # bounded by the keys holding something, never by the keys seen

    def held_by(self, key: str) -> int:
        return self._by_key.get(key, 0)


class Deadlines:
    """The receive deadline of every unary call awaiting its message, kept by ONE timer handle
    (event-loop thread only). All deadlines are ``timeout`` after their start, so the oldest
    read is first in insertion order: the timer is armed for it alone, and on firing cancels the
    reads that are late and re-arms for the next. ``asyncio.timeout`` per read would schedule
    and cancel a timer per call, ≈ 4 µs each, on the loop every call passes through."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._reads: dict[asyncio.Task, float] = {}  # the task reading → its deadline, oldest first
        self._late: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, task: asyncio.Task) -> None:
        loop = asyncio.get_running_loop()
        self._reads[task] = loop.time() + self.timeout
        if self._timer is None:
            self._timer = loop.call_at(self._reads[task], self._fire)

    def expired(self, task: asyncio.Task) -> bool:
        """Whether ``task``'s deadline cancelled its read."""
        return task in self._late

    def end(self, task: asyncio.Task) -> None:
        """Forgets ``task``'s read, ended in any way."""
        self._reads.pop(task, None)
        self._late.discard(task)

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._reads:
            task, deadline = next(iter(self._reads.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._fire)
                return
            del self._reads[task]
            if task.cancel():  # a done task's read has ended already
                self._late.add(task)


class Admission:
    """The gate's counters for one server (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        share = settings.principal_share
        self.rpcs = Shares(settings.max_concurrent_rpcs, share)
        self.bytes = Shares(settings.max_inflight_bytes, share)
        self.watches = Shares(settings.max_health_watches, share)
        self.streams = Shares(settings.max_streaming_calls, share)
        self.receive_timeout = settings.receive_timeout
        self.reads = Deadlines(settings.receive_timeout)
        self.stream_idle_timeout = settings.stream_idle_timeout


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def channel_options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC's server arguments for the HTTP/2 limits of ``config`` (module docstring)."""
    a = config.admission
    return [
        # Off for a single worker, so a second server on a busy port fails loudly.
        ("grpc.so_reuseport", 1 if config.listen.reuse_port else 0),
        ("grpc.max_receive_message_length", config.limits.max_message_bytes),
        ("grpc.max_send_message_length", config.limits.max_message_bytes),
        # A compressed request is handed over as it came, never inflated: 17 kB of gzip would
        # otherwise become a 16 MB message before any limit could be checked (decision 0004).
        ("grpc.per_message_decompression", 0),
        ("grpc.max_concurrent_streams", a.max_streams_per_connection),
        ("grpc.max_connection_idle_ms", _ms(a.idle_timeout)),
        ("grpc.keepalive_time_ms", _ms(a.keepalive_time)),
        ("grpc.keepalive_timeout_ms", _ms(a.keepalive_timeout)),
        ("grpc.keepalive_permit_without_calls", 1),  # a client's pings on an idle connection are allowed...
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(a.min_ping_interval)),  # ...but not faster than this
        ("grpc.http2.max_ping_strikes", 2),  # then GOAWAY
    ]


class RateLimiter:
    """A token bucket per key: ``rate`` requests/s, bursts of up to max(1, rate). A call is
    admitted while the bucket holds a whole token; :meth:`debit` may take it below zero (a
    SelectBatch pays for its items after they are counted), and later calls wait until it refills."""

    MAX_KEYS = 100_000  # beyond this, full buckets (idle keys) are forgotten

    def __init__(self, rate: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate limit must be a finite number of requests/s > 0, got {rate!r}")
        self.rate, self.burst = rate, max(1.0, rate)
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, monotonic time)
        self._lock = threading.Lock()  # the gate admits on the loop, a SelectBatch debits in its thread

    def _level(self, key: str, now: float) -> float:
        tokens, then = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - then) * self.rate)

    def admit(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens = self._level(key, now)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > self.MAX_KEYS:
                self._forget_full(now)
            return True

    def debit(self, key: str, n: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._buckets[key] = (self._level(key, now) - n, now)

    def _forget_full(self, now: float) -> None:
        for key in [k for k in self._buckets if self._level(k, now) >= self.burst]:
            del self._buckets[key]
