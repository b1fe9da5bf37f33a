"""The request threads' hop (recsvc.service.threads): outcomes, the caller's context, cancelled
callers' work skipped, the end-of-work callback and the count of pending work, the thread bound
and shutdown."""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar

import pytest

from recsvc.service.threads import Threads

WHO: ContextVar[str] = ContextVar("who", default="nobody")


def test_result_exception_and_the_callers_context_cross_the_hop() -> None:
    threads = Threads(2, "t")

    async def main() -> tuple[str, str, int]:
        WHO.set("alice")
        here = threading.get_ident()
        seen = await threads.run(lambda: (WHO.get(), threading.get_ident() != here))
        with pytest.raises(ZeroDivisionError):
            await threads.run(lambda: 1 // 0)
        return seen[0], str(seen[1]), await threads.run(lambda: 41 + 1)

    try:
        assert asyncio.run(main()) == ("alice", "True", 42)
    finally:
        threads.shutdown()


def test_a_cancelled_callers_queued_work_never_runs_and_finished_still_fires() -> None:
    threads = Threads(1, "t")
    gate, ran, finished = threading.Event(), [], []

    async def main() -> None:
        first = threads.run(lambda: gate.wait(60), lambda: finished.append("first"))
        second = threads.run(lambda: ran.append("second"), lambda: finished.append("second"))
        second.cancel()  # the caller left while its work waited for the only thread
        assert threads.pending == 2
        gate.set()
        assert await first is True
        while len(finished) < 2:
            await asyncio.sleep(0.001)

    try:
        asyncio.run(main())
    finally:
        threads.shutdown()
    assert ran == [] and finished == ["first", "second"] and threads.pending == 0


def test_finished_fires_when_the_work_ends_not_when_the_caller_stops_waiting() -> None:
    threads = Threads(1, "t")
    release, finished = threading.Event(), []

    async def main() -> None:
        running = threading.Event()

        def work() -> str:
            running.set()
            release.wait(60)
            return "done"

        fut = threads.run(work, lambda: finished.append(True))
        while not running.is_set():
            await asyncio.sleep(0.001)
        fut.cancel()
        await asyncio.sleep(0.01)
        assert finished == [] and threads.pending == 1  # still running: its slot must stay taken
        release.set()
        while not finished:
            await asyncio.sleep(0.001)

    try:
        asyncio.run(main())
    finally:
        threads.shutdown()
    assert finished == [True] and threads.pending == 0


def test_no_more_than_count_threads_and_shutdown_drains_then_refuses() -> None:
    threads = Threads(3, "hop-test")
    release = threading.Event()
    names: set[str] = set()

    def work() -> None:
        names.add(threading.current_thread().name)
        release.wait(60)

    async def main() -> None:
        futures = [threads.run(work) for _ in range(8)]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(*futures)

    asyncio.run(main())
    assert len(names) <= 3 and all(n.startswith("hop-test_") for n in names)
    threads.shutdown()
    threads.shutdown()  # idempotent
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("hop-test_"))

    async def after() -> None:
        await threads.run(lambda: None)

    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(after())


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="at least 1 thread"):
        Threads(0, "t")
