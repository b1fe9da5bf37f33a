"""What the benchmarks share: the synthetic artifact and request payloads, servers in their own
processes (start, stop, CPU accounting), the python ``grpc.aio`` load client and the throwaway
PostgreSQL cluster.

Every server runs in its own process and is measured from outside (:func:`tree_cpu_seconds`), so
the load client's CPU never counts as the server's. The benchmarks import this module and never
each other (:mod:`scripts.bench.service` runs :mod:`scripts.bench.service_batch` for ``--batch``).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import numpy as np

from recsvc.ledger.testing.cluster import Cluster, free_port
from recsvc.service.testing import serve_argv

REPO = Path(__file__).resolve().parents[2]
METHOD = "/recsvc.v1.PrivateSelection/Select"
BATCH_METHOD = "/recsvc.v1.PrivateSelection/SelectBatch"
N_CANDIDATES = 500
BENCH_ITEMS = 2000  # bench_artifact's catalog: item{k} is row k

__all__ = [
    "BATCH_METHOD",
    "BENCH_ITEMS",
    "METHOD",
    "N_CANDIDATES",
    "REPO",
    "Server",
    "batch_bodies",
    "bench_artifact",
    "children_cpu",
    "db_cpu_seconds",
    "free_port",
    "fresh",
    "launch",
    "load",
    "payloads",
    "rows_encoded",
    "select_bodies",
    "start_server",
    "stop",
    "throwaway_cluster",
    "tree_cpu_seconds",
]


# ----------------------------------------------------------------------------- artifact and payloads


def bench_artifact(out: Path, n_items: int = BENCH_ITEMS, seed: int = 0) -> Path:
    """A synthetic artifact with n_items clip ranges and a positive population Spearman."""
    import polars as pl

    from recsvc.artifact import ArtifactWriter

    rng = np.random.default_rng(seed)
    ids = [f"item{k}" for k in range(n_items)]
    lo = rng.uniform(0, 0.05, n_items)
    hi = lo + rng.uniform(0.01, 1.0, n_items)
    with ArtifactWriter(out) as w:
        w.write_items(pl.DataFrame({"item_id": ids, "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)}))
        w.write_candidates(
            pl.DataFrame({"user_id": ["u"], "rank": [0], "item_id": ["item0"], "score": [0.1]}).cast({"rank": pl.Int32})
        )
        return w.commit(
            {
                "dataset": "bench",
                "seed": seed,
                "population_spearman": {"median": 0.3, "mean": 0.3, "frac_positive": 0.8, "users": 100},
            }
        )


def payloads(count: int, mechanism: str, seed: int = 1, encoding: str = "columns") -> list[bytes]:
    """Serialized SelectRequests, each with a fresh request_id; `columns` is what Client sends."""
    from recsvc.v1 import selection_pb2 as pb

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        ids = [f"item{k}" for k in rng.choice(BENCH_ITEMS, N_CANDIDATES, replace=False)]
        scores = rng.uniform(0, 1, N_CANDIDATES).tolist()
        req = pb.SelectRequest(
            user_id=f"bench-{i % 1000}", mechanism=mechanism, epsilon=0.001, request_id=uuid.uuid4().hex
        )
        if encoding == "columns":
            req.item_ids.extend(ids)
            req.scores.extend(scores)
        else:
            req.candidates.extend(pb.Candidate(item_id=k, score=s) for k, s in zip(ids, scores, strict=False))
        out.append(req.SerializeToString())
    return out


def fresh(body: bytes) -> bytes:
    """The same SelectRequest with a new request_id: a new charge, not a replay."""
    from recsvc.v1 import selection_pb2 as pb

    req = pb.SelectRequest.FromString(body)
    req.request_id = uuid.uuid4().hex
    return req.SerializeToString()


def rows_encoded(body: bytes) -> bytes:
    """The same SelectRequest with item rows and the catalog version instead of item ids."""
    from recsvc.service.catalog import catalog_version
    from recsvc.v1 import selection_pb2 as pb

    req = pb.SelectRequest.FromString(body)
    rows = [int(i.removeprefix("item")) for i in req.item_ids]
    del req.item_ids[:]
    req.item_rows.extend(rows)
    req.catalog_version = catalog_version(f"item{k}" for k in range(BENCH_ITEMS))
    return req.SerializeToString()


def select_bodies(count: int, seed: int, encoding: str) -> list[bytes]:
    """rnm SelectRequests with item ids (``ids``) or item rows (``rows``)."""
    bodies = payloads(count, "rnm", seed=seed)
    return bodies if encoding == "ids" else [rows_encoded(b) for b in bodies]


def batch_bodies(batches: int, size: int, seed: int, encoding: str = "ids") -> list[bytes]:
    """Serialized SelectBatchRequests of ``size`` fresh rnm items each (every item a new charge),
    each item for another user: batch b holds users ``size*b`` to ``size*(b+1) - 1``, as a frontend
    batching many users' requests would send (the same ``size`` users in every batch would make
    concurrent batches queue for the same rows: a contention test, not a throughput one)."""
    from recsvc.v1 import selection_pb2 as pb

    items = [pb.SelectRequest.FromString(b) for b in select_bodies(size, seed, encoding)]
    out = []
    for b in range(batches):
        for j, it in enumerate(items):
            it.request_id, it.user_id = uuid.uuid4().hex, f"batch-user-{b * size + j}"
        out.append(pb.SelectBatchRequest(requests=items).SerializeToString())
    return out


# ----------------------------------------------------------------------------- processes and CPU


def serve_command(artifacts: Path, ledger: Path | str, port: int, *extra: str) -> list[str]:
    """`recsvc serve` on ``port`` with a budget no benchmark exhausts, then ``extra`` flags."""
    return serve_argv(artifacts, ledger, port, "--budget", "1e6", *extra)


def launch(cmd: list[str], what: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A server process, returned once it printed that it is listening."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline()
    if not re.search(r"listening on", line):
        raise RuntimeError(f"{what} did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (a graceful drain), then SIGKILL after 15 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU so far of process ``pid`` and its descendants alive now."""
    import psutil

    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            total += sum(p.cpu_times()[:2])
    return total


def children_cpu() -> float:
    """User + system CPU of this process's finished children (e.g. h2load runs)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Server:
    """A server in its own process on a free loopback port: ``recsvc serve`` for kind ``sync``.
    Subclasses serve other kinds by overriding :meth:`command`."""

    def __init__(
        self,
        kind: str,
        artifacts: Path,
        tmp: Path,
        workers: int = 1,
        extra: tuple[str, ...] = (),
        ledger: str | None = None,
    ) -> None:
        """``ledger``: a PostgreSQL URL for the sync server (default: a fresh SQLite file in tmp)."""
        self.kind, self.port, self.workers = kind, free_port(), workers
        self.ledger = tmp / f"ledger-{kind}-{workers}-{uuid.uuid4().hex[:6]}.db"
        self.ledger_target = ledger or str(self.ledger)
        self.db_pid: int | None = None  # the PostgreSQL postmaster behind the ledger, if any
        self.proc = launch(self.command(artifacts, extra), f"{kind} server")

    def command(self, artifacts: Path, extra: tuple[str, ...]) -> list[str]:
        if self.kind != "sync":
            raise ValueError(f"{type(self).__name__} serves only kind 'sync', not {self.kind!r}")
        return serve_command(
            artifacts, self.ledger_target, self.port, "--workers", str(self.workers), "--drain-delay", "0", *extra
        )

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process and its worker processes so far."""
        return tree_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop(self.proc)


def throwaway_cluster(stack: ExitStack, **options: Any) -> Cluster:
    """A fresh PostgreSQL cluster on loopback (the project's test cluster), removed when ``stack``
    closes; ``options`` go to its ``start_cluster`` (e.g. ``shared_buffers``)."""
    from recsvc.ledger.testing.cluster import remove_cluster, start_cluster

    cluster = start_cluster(**options)
    stack.callback(remove_cluster, cluster)
    return cluster


def start_server(kind: str, art: Path, tmp: Path, workers: int, stack: ExitStack) -> Server:
    """``recsvc serve`` on a durable SQLite ledger in tmp (kind ``sqlite``), or (``postgresql``) on a
    fresh database of a throwaway PostgreSQL cluster prepared with ``recsvc ledger init``."""
    if kind == "sqlite":
        return Server("sync", art, tmp, workers)
    cluster = throwaway_cluster(stack, shared_buffers="128MB")  # PostgreSQL's default (the tests' clusters use less)
    url, key = cluster.new_database(), tmp / "pg.key"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "recsvc.app.cli",
            "ledger",
            "init",
            "--ledger",
            url,
            "--budget",
            "1e6",
            "--fingerprint-key",
            str(key),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    srv = Server("sync", art, tmp, workers, ledger=url, extra=("--fingerprint-key", str(key)))
    srv.db_pid = cluster.postmaster_pid()
    return srv


def db_cpu_seconds(srv: Server) -> float:
    """User + system CPU of the PostgreSQL server's processes so far (0 for SQLite: in-process).
    The server shares the 2 cores, so its CPU per selection is part of the PostgreSQL cost."""
    return 0.0 if srv.db_pid is None else tree_cpu_seconds(srv.db_pid)


# ----------------------------------------------------------------------------- load client


async def load(
    port: int, bodies: list[bytes], concurrency: int, channels: int = 4, method: str = METHOD
) -> dict[str, float]:
    """Sends ``bodies`` (serialized, raw bytes in and out: minimal client CPU) from ``concurrency``
    workers over ``channels`` connections; QPS and p50/p99 latency."""
    import grpc

    # A local subchannel pool per channel: otherwise grpc shares ONE TCP connection among all
    # channels to the same target, and SO_REUSEPORT would hand every request to one worker.
    chans = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(channels)
    ]
    calls = [c.unary_unary(method) for c in chans]
    for call in calls:  # warm up every connection (a batch's warm-up replays: nothing new charged)
        await call(fresh(bodies[0]) if method == METHOD else bodies[0])
    latencies = np.empty(len(bodies))
    nxt = 0

    async def worker(w: int) -> None:
        nonlocal nxt
        call = calls[w % channels]
        while nxt < len(bodies):
            i = nxt
            nxt += 1
            t = time.perf_counter()
            await call(bodies[i])
            latencies[i] = time.perf_counter() - t

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    for c in chans:
        await c.close()
    return {
        "qps": len(bodies) / wall,
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "requests": len(bodies),
    }
