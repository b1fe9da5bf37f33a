"""Threads that run a call's synchronous part off the event loop: a stdlib ``ThreadPoolExecutor``
whose results come back to the loop with one ``call_soon_threadsafe``.

The gate runs PrivateSelection methods in the request threads (``--threads``; a lone light
Select on the loop itself) and the heavy queue runs heavy calls in threads of its own
(decision 0005). A hand-written hop was not worth 5 % against the executor
(docs/conventions.md, "Transport paths").

What ``asyncio.wrap_future`` would not give, and both users rely on: the end-of-work callback and
:attr:`Threads.pending` follow the work, not the caller. Each submitted job settles, in a
``finally`` in its thread, by scheduling the caller's outcome, the ``pending`` decrement and
``finished`` on the loop, so a caller cancelled while its work runs leaves it counted until it
has ended (the gate's ``alone`` test; the heavy queue's slots bound threads and memory). Work whose
caller has gone before a thread takes it does not run (nothing is decoded, drawn or spent for a
call nobody waits for), and still settles once. The executor's own future is never cancelled, so
every job runs its ``finally`` exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Threads:
    """Up to ``count`` threads named ``name``_i, started as the work needs them."""

    def __init__(self, count: int, name: str) -> None:
        if count < 1:
            raise ValueError(f"a thread pool needs at least 1 thread, got {count}")
        self.count, self.name = count, name
        self._pool = ThreadPoolExecutor(count, thread_name_prefix=name)
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

        def settled() -> None:  # on the loop, once the work ended or was skipped
            self.pending -= 1
            if finished is not None:
                finished()

        self._pool.submit(_job, loop, future, contextvars.copy_context().run, fn, settled)
        self.pending += 1  # after submit: a refused submit leaves nothing to settle
        return future

    def shutdown(self) -> None:
        """Lets the queued and running work end (a cancelled caller's is skipped), then stops
        the threads. Idempotent."""
        self._closed = True
        self._pool.shutdown(wait=True)


def _job(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    run: Callable[..., Any],
    fn: Callable[[], Any],
    settled: Callable[[], None],
) -> None:
    """In a pool thread: ``fn`` unless its caller is gone, then its outcome to the loop."""
    value, error = None, None
    try:
        if not future.cancelled():  # the caller is gone: run nothing for it
            value = run(fn)
    except BaseException as exc:  # the caller's to handle, as an await would raise it
        error = exc
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, future, value, error, settled)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None, settled: Callable[[], None]) -> None:
    try:
        if not future.done():  # cancelled: the caller stopped waiting
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
    finally:
        settled()
