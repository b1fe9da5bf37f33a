"""The request threads' hop (recsvc.service.threads): outcomes, the caller's context, cancelled
callers' work skipped, the end-of-work callback and the count of pending work, the thread bound
and shutdown."""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar
from functools import partial

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


def test_a_caller_cancelled_while_its_work_runs_keeps_it_pending_until_it_ends() -> None:
    """As when a client cancels its call: the awaiting task is cancelled while the work runs. The
    work stays counted and ``finished`` waits for it, then runs once, after the work ended."""
    threads = Threads(1, "t")
    running, release = threading.Event(), threading.Event()
    ended: list[bool] = []
    finished: list[bool] = []

    def work() -> str:
        running.set()
        release.wait(60)
        ended.append(True)
        return "done"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        settled = asyncio.Event()

        def on_finished() -> None:
            finished.append(bool(ended))  # whether the work had ended when this ran
            settled.set()

        async def call() -> str:
            return await threads.run(work, on_finished)

        task = asyncio.create_task(call())
        await loop.run_in_executor(None, running.wait, 60)  # the work is in its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(5):  # callbacks of the cancellation (a done callback's would run here)
            await asyncio.sleep(0)
        assert finished == [] and threads.pending == 1  # blocked on release: it cannot have ended
        release.set()
        await settled.wait()
        assert threads.pending == 0
        threads.shutdown()  # the thread is gone, so no second settle can still be on its way
        for _ in range(5):
            await asyncio.sleep(0)

    try:
        asyncio.run(main())
    finally:
        release.set()
        threads.shutdown()
    assert finished == [True] and threads.pending == 0


def test_every_call_settles_exactly_once_whenever_its_caller_is_cancelled() -> None:
    """Cancelled before a thread takes the work, while it runs, or not at all: ``finished`` runs
    once per call and ``pending`` returns to 0."""
    threads = Threads(2, "t")
    n, ran, finished = 300, list[int](), list[int]()

    async def main() -> None:
        settled = asyncio.Event()

        def on_finished() -> None:
            finished.append(1)
            if len(finished) == n:
                settled.set()

        futures = [threads.run(partial(ran.append, i), on_finished) for i in range(n)]
        for i, f in enumerate(futures):
            if i % 3:
                f.cancel()
            if i % 7 == 0:
                await asyncio.sleep(0)  # let some work start before the next cancellations
        await settled.wait()
        threads.shutdown()
        for _ in range(5):
            await asyncio.sleep(0)
        assert all(f.done() for f in futures)
        assert [f.result() for i, f in enumerate(futures) if not f.cancelled()] == [None] * sum(
            not f.cancelled() for f in futures
        )

    try:
        asyncio.run(main())
    finally:
        threads.shutdown()
    assert len(finished) == n and threads.pending == 0 and set(range(0, n, 3)) <= set(ran)


def test_a_heavy_calls_slot_is_held_until_its_work_ends() -> None:
    """The heavy queue releases a slot when the work ends, not when its caller stops waiting."""
    from recsvc.service.draws import HeavyCalls

    heavy = HeavyCalls(2, 1, 50_000)
    running, release = threading.Event(), threading.Event()

    def work() -> None:
        running.set()
        release.wait(60)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(heavy.run("alice", work))
        await loop.run_in_executor(None, running.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(5):
            await asyncio.sleep(0)
        assert heavy.held == 1
        release.set()
        while heavy.held:  # released by the end-of-work callback, on this loop
            await asyncio.sleep(0.001)

    try:
        asyncio.run(main())
    finally:
        release.set()
        heavy.shutdown()
    assert heavy.held == 0
