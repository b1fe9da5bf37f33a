"""Execution engines shared by the offline pipeline and the evaluation harness.

The work unit is a pure, picklable function ``fn(chunk, context) -> result``. ``context`` is
large read-only data (a model, an artifact's arrays) shipped once per worker, not per chunk.
Results come back in chunk order, so any reduction is deterministic whatever the engine:
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
from typing import Any, Protocol, TypeVar

from tqdm.auto import tqdm

from recsvc.checks import check_int

C = TypeVar("C")
R = TypeVar("R")

_CONTEXT: Any = None


def _set_context(context: Any) -> None:
    global _CONTEXT
    _CONTEXT = context


def _call_with_context(fn: Callable[[Any, Any], Any], chunk: Any) -> Any:
    return fn(chunk, _CONTEXT)


class Engine(Protocol):
    def map(
        self,
        fn: Callable[[C, Any], R],
        chunks: Sequence[C],
        context: Any = None,
        *,
        desc: str = "",
        unit: str = "chunk",
        sizes: Sequence[int] | None = None,
    ) -> Iterator[R]:
        """Yields ``fn(chunk, context)`` for every chunk, in order, with a progress bar.

        ``sizes`` gives each chunk's weight in ``unit`` (e.g. users) for the bar's rate and ETA.
        """
        ...

    def close(self) -> None: ...


def progress_bar(desc: str, unit: str, total: int, disable: bool | None) -> tqdm:
    """The progress bar every long-running command shows (``disable`` None: tqdm decides, off when
    not a TTY); the engines' map and ``recsvc ledger export`` use it."""
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, mininterval=0.5)


@dataclass
class LocalEngine:
    workers: int = 1
    progress: bool | None = None  # None: tqdm decides (off when not a TTY)
    _pool: ProcessPoolExecutor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be ≥ 1, got {self.workers}")

    def map(self, fn, chunks, context=None, *, desc="", unit="chunk", sizes=None):
        sizes = list(sizes) if sizes is not None else [1] * len(chunks)
        disable = None if self.progress is None else not self.progress
        with progress_bar(desc, unit, sum(sizes), disable) as bar:
            if self.workers == 1 or len(chunks) <= 1:
                for chunk, size in zip(chunks, sizes, strict=True):
                    out = fn(chunk, context)
                    bar.update(size)
                    yield out
                return
            # A fresh pool per call: the context is installed once per worker by the initializer.
            with ProcessPoolExecutor(
                max_workers=min(self.workers, len(chunks)), initializer=_set_context, initargs=(context,)
            ) as pool:
                # Bounded look-ahead keeps memory flat however many chunks there are.
                window = 2 * self.workers
                pending = deque(pool.submit(_call_with_context, fn, c) for c in chunks[:window])
                nxt = len(pending)
                for i in range(len(chunks)):
                    out = pending.popleft().result()  # popped: a finished result is not held twice
                    if nxt < len(chunks):
                        pending.append(pool.submit(_call_with_context, fn, chunks[nxt]))
                        nxt += 1
                    bar.update(sizes[i])
                    yield out

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
        sizes = list(sizes) if sizes is not None else [1] * len(chunks)
        # hash=False: a key of its own, so releasing another map's identical context cannot take
        # this one's data with it (tasks then fail with "lost dependencies").
        ctx = client.scatter(context, broadcast=True, hash=False) if context is not None else None
        disable = None if self.progress is None else not self.progress
        window = max(2 * len(client.scheduler_info().get("workers", {}) or [1]), 2)
        with progress_bar(desc, unit, sum(sizes), disable) as bar:
            futures: dict[int, Any] = {}
            nxt = 0
            for i in range(len(chunks)):
                while nxt < len(chunks) and nxt < i + window:
                    futures[nxt] = client.submit(fn, chunks[nxt], ctx, pure=False)
                    nxt += 1
                out = futures.pop(i).result()
                bar.update(sizes[i])
                yield out

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
