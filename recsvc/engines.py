"""Execution engines shared by the offline pipeline and the evaluation harness.

An engine's ``map(fn, chunks, context, desc=, unit=, sizes=)`` yields ``fn(chunk, context)`` for
every chunk, with a progress bar (``sizes``: each chunk's weight in ``unit``, e.g. users, for its
rate and ETA). The work unit ``fn`` is a pure, picklable function. ``context`` is large read-only
data (a model, an artifact's arrays) shipped once per worker, not per chunk. Results come back in
chunk order, so any reduction is deterministic whatever the engine:
with per-user seeds (docs/reference/specification.md §3) a local run and a Dask run give identical output.

- :class:`LocalEngine` — in-process for ``workers=1``, else a process pool.
- :class:`DaskEngine` — a Dask distributed scheduler (``scheduler="tcp://host:8786"``) or a
  private LocalCluster on loopback when no address is given.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from recsvc.checks import check_int

_CONTEXT: Any = None


def _set_context(context: Any) -> None:
    global _CONTEXT
    _CONTEXT = context


def _call_with_context(fn: Callable[[Any, Any], Any], chunk: Any) -> Any:
    return fn(chunk, _CONTEXT)


def progress_bar(desc: str, unit: str, total: int, disable: bool | None) -> tqdm:
    """The progress bar every long-running command shows (``disable`` None: tqdm decides, off when
    not a TTY); the engines' map and ``recsvc ledger export`` use it."""
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, mininterval=0.5)


def _in_order(
    start: Callable[[int], Callable[[], Any]],
    chunks: Sequence[Any],
    window: int,
    progress: bool | None,
    desc: str,
    unit: str,
    sizes: Sequence[int] | None,
) -> Iterator[Any]:
    """Both engines' results in chunk order, under a progress bar (``progress`` None: tqdm
    decides); ``start(i)`` starts chunk i and returns what waits for its result. A chunk is read
    from ``chunks`` (which may build it then) only when it starts, and at most ``window`` are
    under way: a bounded look-ahead keeps memory flat however many chunks there are."""
    sizes = list(sizes) if sizes is not None else [1] * len(chunks)
    with progress_bar(desc, unit, sum(sizes), None if progress is None else not progress) as bar:
        pending = deque(start(i) for i in range(min(window, len(chunks))))
        for i in range(len(chunks)):
            out = pending.popleft()()  # popped: a finished result is not held twice
            if i + window < len(chunks):
                pending.append(start(i + window))
            bar.update(sizes[i])
            yield out


@dataclass
class LocalEngine:
    workers: int = 1
    progress: bool | None = None  # None: tqdm decides (off when not a TTY)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be ≥ 1, got {self.workers}")

    def map(self, fn, chunks, context=None, *, desc="", unit="chunk", sizes=None):
        if self.workers == 1 or len(chunks) <= 1:
            yield from _in_order(lambda i: lambda: fn(chunks[i], context), chunks, 1, self.progress, desc, unit, sizes)
            return
        # A fresh pool per call: the context is installed once per worker by the initializer.
        with ProcessPoolExecutor(
            max_workers=min(self.workers, len(chunks)), initializer=_set_context, initargs=(context,)
        ) as pool:
            window = 2 * self.workers
            yield from _in_order(
                lambda i: pool.submit(_call_with_context, fn, chunks[i]).result,
                chunks,
                window,
                self.progress,
                desc,
                unit,
                sizes,
            )

    def close(self) -> None:
        pass


@dataclass
class DaskEngine:
    scheduler: str | None = None
    workers: int = 2
    progress: bool | None = None
    _client: Any = field(default=None, init=False, repr=False)
    _cluster: Any = field(default=None, init=False, repr=False)

    def _connect(self) -> Any:
        if self._client is None:
            from distributed import Client, LocalCluster

            if self.scheduler:
                try:
                    self._client = Client(self.scheduler, timeout="20s")
                except (OSError, TimeoutError) as exc:
                    raise ValueError(
                        f"cannot reach the Dask scheduler at {self.scheduler} ({exc}); expected a running "
                        "scheduler address such as tcp://host:8786"
                    ) from None
            else:
                self._cluster = LocalCluster(
                    n_workers=self.workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=40,
                )
                self._client = Client(self._cluster)
        return self._client

    def map(self, fn, chunks, context=None, *, desc="", unit="chunk", sizes=None):
        client = self._connect()
        # hash=False: a key of its own, so releasing another map's identical context cannot take
        # this one's data with it (tasks then fail with "lost dependencies").
        ctx = client.scatter(context, broadcast=True, hash=False) if context is not None else None
        window = max(2 * len(client.scheduler_info().get("workers", {}) or [1]), 2)
        yield from _in_order(
            lambda i: client.submit(fn, chunks[i], ctx, pure=False).result,
            chunks,
            window,
            self.progress,
            desc,
            unit,
            sizes,
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> DaskEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_workers(workers: int | None) -> int:
    """The worker count: None means min(2, cores); anything else must be an integer ≥ 1."""
    return min(2, os.cpu_count() or 1) if workers is None else check_int("workers", workers, 1)


def make_engine(
    engine: str = "local", workers: int | None = None, scheduler: str | None = None, progress: bool | None = None
) -> LocalEngine | DaskEngine:
    """``engine`` is "local" or "dask"; a ``scheduler`` address implies Dask."""
    workers = resolve_workers(workers)
    if scheduler or engine == "dask":
        return DaskEngine(scheduler=scheduler, workers=workers, progress=progress)
    if engine != "local":
        raise ValueError(f"unknown engine {engine!r}; expected 'local' or 'dask'")
    return LocalEngine(workers=workers, progress=progress)


def chunk_ranges(total: int, chunk_size: int) -> list[range]:
    """Contiguous index ranges of at most ``chunk_size``; the standard way to cut users into chunks."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    return [range(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]
