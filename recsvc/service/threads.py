"""Threads that run a call's synchronous part off the event loop, and the hop there and back.

The gate runs PrivateSelection methods in the request threads (``--threads``; a lone light
Select on the loop itself) and the heavy queue runs heavy calls in threads of its own
(decision 0005). A call pays for the hop twice (loop → thread → loop), so it costs one queue put
and one ``call_soon_threadsafe``:
:meth:`Threads.run` puts the work on a queue and returns at once (the loop goes back to its
poll and frees the GIL for the woken thread), and the thread hands the outcome straight to the
loop as the last thing it does before it waits again (so the woken loop finds the GIL free).
``asyncio.wrap_future(ThreadPoolExecutor.submit(fn))`` instead builds a concurrent future (a
condition and a lock), a work item and a chained asyncio future per call on the loop after the
thread was woken, and its thread still holds the GIL for that bookkeeping after it has woken
the loop. Time stamps in the gate, 3000 lone Selects on a loaded 2-core host: loop → thread
p50 31–60 µs with the executor, 11–14 µs with this; thread → loop 58–101 µs, 49–52 µs
(docs/performance.md, "A server no client can pin").

Work whose caller has gone (its future cancelled) before a thread takes it does not run:
nothing is decoded, drawn or spent for a call nobody waits for. :attr:`Threads.pending` counts
the work queued or running until its outcome is back on the loop, so the gate knows when none is.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

# loop, the caller's future, its context's run, the work, the on-loop callback once it ended
_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], Callable[[], Any], Callable[[], None]
]


class Threads:
    """Up to ``count`` threads named ``name``_i, started as the work needs them."""

    def __init__(self, count: int, name: str) -> None:
        if count < 1:
            raise ValueError(f"a thread pool needs at least 1 thread, got {count}")
        self.count, self.name = count, name
        self._queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._idle = threading.Semaphore(0)  # one release per thread waiting for work
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self.pending = 0  # work queued or running, counted on the loop (the gate's "alone" test)

    def run(self, fn: Callable[[], T], finished: Callable[[], None] | None = None) -> asyncio.Future[T]:
        """``fn()`` in one of the threads, with the calling task's context (its caller); the
        returned future, of the running loop, gets its result or exception. ``finished`` runs on
        the loop once ``fn`` has ended (or was skipped), even if the caller stopped waiting."""
        if self._closed:
            raise RuntimeError(f"the {self.name} threads are shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.pending += 1
        self._queue.put((loop, future, contextvars.copy_context().run, fn, self._settled(finished)))
        if not self._idle.acquire(blocking=False):
            self._start_one()
        return future

    def _settled(self, finished: Callable[[], None] | None) -> Callable[[], None]:
        def done() -> None:  # on the loop, once the work ended or was skipped
            self.pending -= 1
            if finished is not None:
                finished()

        return done

    def _start_one(self) -> None:
        with self._lock:
            if len(self._threads) < self.count and not self._closed:
                t = threading.Thread(target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()

    def _serve(self) -> None:
        while (job := self._queue.get()) is not None:
            loop, future, run, fn, finished = job
            del job
            value, error = None, None
            if not future.cancelled():  # the caller is gone: run nothing for it
                try:
                    value = run(fn)
                except BaseException as exc:  # the caller's to handle, as an await would raise it
                    error = exc
            del fn, run
            # The loop's wake-up is the last thing this thread does before it waits again, so the
            # loop finds the GIL free.
            self._idle.release()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, value, error, finished)
            del loop, future, value, error, finished

    def shutdown(self) -> None:
        """Lets the queued and running work end (a cancelled caller's is skipped), then stops
        the threads. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._queue.put(None)
        for t in self._threads:
            t.join()


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None, finished: Callable[[], None]) -> None:
    try:
        if not future.done():  # cancelled: the caller stopped waiting
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
    finally:
        finished()
