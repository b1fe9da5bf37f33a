"""What each hand-written transport path is worth: the server with it against the same server
without it, in one run, the servers taking turns round by round.

Every variant is ``recsvc serve`` (one worker, a durable SQLite ledger in a temporary directory) on
the same artifact, with one path replaced in its process by the plain way of doing the same thing
(benchmark-only patches, applied before the server is built; :func:`patch`):

- ``current``: the server as shipped;
- ``wrapped``: the server as shipped, started through this module as the patched variants are (its
  imports make a larger process, ≈ 5 % slower a lone call than ``current``): the baseline the
  patched variants are judged against;
- ``no-loop``: no lone call on the event loop (``aioserver.inline_methods`` returns no method), so
  every Select is prepared and run in a request thread;
- ``executor``: the request threads are a ``ThreadPoolExecutor`` reached through
  ``asyncio.wrap_future`` instead of :class:`recsvc.service.threads.Threads`;
- ``no-prescan``: requests parsed by protobuf alone, without the bounded pre-scan and the batch's
  item-by-item counting (the pre-scan is a security bound, F2; this row only prices it);
- ``float-samplers``: the float64 samplers issue 36's exact ones replaced
  (:mod:`scripts.bench.float_samplers`; not a transport path: the service's cost of exactness);
- ``echo``: the no-op echo server of :mod:`scripts.bench.service` (same gRPC stack);
- ``before`` (``--before DIR``): the server of another checkout (``git worktree add DIR <commit>``),
  run with that tree first on PYTHONPATH.

After one warm-up round that is not kept, each round sends lone Selects (concurrency 1: the
median latency) to all the servers in turn, call by call, the order reversed every call; then each
server in turn (the order reversed every other round) takes Select at concurrency 32 (QPS and
server CPU per call) from ``h2load`` (``apt-get install nghttp2-client``; ≈ 40 µs of client CPU a
call, so the server has the cores; without it the python ``grpc.aio`` client) and SelectBatch of
100 rnm items at concurrency 4 (selections/s, server CPU per selection). Every request is a fresh
charge. Ratios are to ``current`` within the same round; the summary gives each ratio's median
over the rounds. Only ratios within one run mean anything on a shared host.

Usage: ``.venv/bin/python -m scripts.bench.transport [--rounds 8] [--variants current,wrapped,no-loop,...]
[--before /tmp/old] [--tmp /dev/shm]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.harness import (
    BATCH_METHOD,
    METHOD,
    Server,
    batch_bodies,
    bench_artifact,
    free_port,
    launch,
    load,
    payloads,
    serve_command,
    stop,
    tree_cpu_seconds,
)
from scripts.bench.service import h2load_body, h2load_run

MODULE = "scripts.bench.transport"
PATCHED = ("wrapped", "no-loop", "executor", "no-prescan", "float-samplers")
VARIANTS = ("current", *PATCHED, "echo")


def patch(variant: str) -> None:
    """Replaces one transport path, in this process, by the plain way of doing the same thing."""
    if variant == "wrapped":
        return
    if variant == "no-loop":
        from recsvc.service import aioserver

        aioserver.inline_methods = lambda config: ()
    elif variant == "executor":
        from recsvc.service import threads

        threads.Threads = ExecutorThreads  # type: ignore[misc,assignment]  # the same interface
    elif variant == "no-prescan":
        from recsvc.service import codec

        def decoder(message_type: Any, shape: Any, limits: Any) -> Any:
            def decode(data: bytes) -> Any:
                return message_type.FromString(data)

            return decode

        codec.decoder = decoder
    elif variant == "float-samplers":
        from scripts.bench import float_samplers

        float_samplers.install()
    else:
        raise ValueError(f"no patch named {variant!r}")


class ExecutorThreads:
    """:class:`recsvc.service.threads.Threads`'s interface over a ``ThreadPoolExecutor``."""

    def __init__(self, count: int, name: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(count, thread_name_prefix=name)
        self.pending = 0

    def run(self, fn: Any, finished: Any = None) -> asyncio.Future[Any]:
        import contextvars

        self.pending += 1
        future = asyncio.wrap_future(self._pool.submit(contextvars.copy_context().run, fn))

        def done(_: object) -> None:
            self.pending -= 1
            if finished is not None:
                finished()

        future.add_done_callback(done)
        return future

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class Variant(Server):
    """One variant's server in its own process."""

    def __init__(self, kind: str, artifacts: Path, tmp: Path, before: Path | None = None) -> None:
        self.before = before
        super().__init__(kind, artifacts, tmp)

    def command(self, artifacts: Path, extra: tuple[str, ...]) -> list[str]:
        serve = serve_command(artifacts, self.ledger_target, self.port, "--workers", "1", "--drain-delay", "0")
        if self.kind == "current":
            return serve
        if self.kind == "echo":
            return [sys.executable, "-m", "scripts.bench.service", "--serve-echo", str(self.port)]
        if self.kind == "before":
            return serve
        return [sys.executable, "-m", MODULE, "--serve", self.kind, *serve[3:]]  # after "-m recsvc.app.cli"


def start(kind: str, art: Path, tmp: Path, before: Path | None) -> Server:
    if kind != "before":
        return Variant(kind, art, tmp)
    assert before is not None
    srv = Variant.__new__(Variant)
    srv.kind, srv.port, srv.workers, srv.before = kind, free_port(), 1, before
    srv.ledger = tmp / "ledger-before.db"
    srv.ledger_target = str(srv.ledger)
    env = {**os.environ, "PYTHONPATH": str(before)}
    srv.proc = launch(srv.command(art, ()), "before server", cwd=before, env=env)
    return srv


async def lone_calls(servers: dict[str, Server], order: list[str], n: int, seed: int) -> dict[str, list[float]]:
    """``n`` lone Selects to each server, the servers in turn call by call (the order reversed
    every call), so the host's drifting load falls on all alike; each server's latencies (s)."""
    import time

    import grpc

    chans = {k: grpc.aio.insecure_channel(f"127.0.0.1:{servers[k].port}") for k in order}
    calls = {k: chans[k].unary_unary(METHOD) for k in order}
    bodies = {k: payloads(n + 1, "rnm", seed=seed + j) for j, k in enumerate(order)}
    for k in order:
        await calls[k](bodies[k][n])  # a warm connection
    seen: dict[str, list[float]] = {k: [] for k in order}
    for i in range(n):
        for k in order if i % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            await calls[k](bodies[k][i])
            seen[k].append(time.perf_counter() - t)
    for c in chans.values():
        await c.close()
    return seen


def one_round(
    servers: dict[str, Server], order: list[str], r: int, n1: int, n32: int, nb: int, h2load: Path | None
) -> dict[str, dict]:
    seed = 1000 * r  # round 99 is the warm-up
    lone = asyncio.run(lone_calls(servers, order, n1, seed))
    out: dict[str, dict] = {
        k: {"c1_p50_ms": statistics.median(lone[k]) * 1e3, "c1_p99_ms": float(np.percentile(lone[k], 99)) * 1e3}
        for k in order
    }
    for j, kind in enumerate(order):
        srv, row = servers[kind], out[kind]
        if h2load is not None:  # the C client: ≈ 40 µs of client CPU a call, so the server has the cores
            body = h2load_body("rnm", f"h2load-{seed + j}", seed + j)
            cpu0 = tree_cpu_seconds(srv.proc.pid)
            h2 = h2load_run(srv.port, body, n32, 32, h2load)
            row["c32_qps"] = h2["qps"]
            row["c32_cpu_us"] = (tree_cpu_seconds(srv.proc.pid) - cpu0) / n32 * 1e6
        else:
            bodies = payloads(n32, "rnm", seed=seed + 50 + j)
            cpu0 = tree_cpu_seconds(srv.proc.pid)
            c32 = asyncio.run(load(srv.port, bodies, 32, channels=4))
            row["c32_qps"] = c32["qps"]
            row["c32_cpu_us"] = (tree_cpu_seconds(srv.proc.pid) - cpu0) / n32 * 1e6
        if kind != "echo":
            bodies = batch_bodies(nb, 100, seed + j)
            cpu0 = tree_cpu_seconds(srv.proc.pid)
            b = asyncio.run(load(srv.port, bodies, 4, channels=4, method=BATCH_METHOD))
            row["batch_sel_s"] = b["qps"] * 100
            row["batch_cpu_us_per_sel"] = (tree_cpu_seconds(srv.proc.pid) - cpu0) / (nb * 100) * 1e6
        print(json.dumps({"round": r, "server": kind, **row}), flush=True)
    return out


def summarize(rounds: list[dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Each variant's median ratio to ``current`` over the rounds, per measure."""
    summary: dict[str, dict[str, float]] = {}
    for kind in rounds[0]:
        summary[kind] = {}
        for key in rounds[0][kind]:
            ratios = [rd[kind][key] / rd["current"][key] for rd in rounds if key in rd["current"]]
            if ratios:
                summary[kind][key] = round(statistics.median(ratios), 3)
    return summary


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        patch(sys.argv[2])
        from recsvc.app.cli import main as cli

        return cli(sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--before", type=Path, help="a checkout of the code before, served as variant 'before'")
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the rounds and the summary here")
    ap.add_argument(
        "--tmp",
        type=Path,
        help="where the ledgers go (default: the system's temporary directory; /dev/shm takes the disk's "
        "fsync out of every call, so the paths' own cost is not lost in its noise)",
    )
    args = ap.parse_args()
    kinds = [k for k in args.variants.split(",") if k]
    if "current" not in kinds or set(kinds) - {*VARIANTS, "before"}:
        ap.error(f"--variants must include current and name only {', '.join((*VARIANTS, 'before'))}")
    if args.before is not None and "before" not in kinds:
        kinds.append("before")
    n1, n32, nb = (30, 200, 4) if args.quick else (150, 500, 12)
    rounds: list[dict[str, dict]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the servers are stopped on the way out
    with tempfile.TemporaryDirectory(prefix="bench-transport-", dir=args.tmp) as td:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")
        h2load = tmp if shutil.which("h2load") else None  # its body and log files go to tmp
        servers: dict[str, Server] = {}
        try:
            for k in kinds:
                servers[k] = start(k, art, tmp, args.before)
            one_round(
                servers, kinds, 99, 20, 200, 4, h2load
            )  # warm-up (compiled kernels, caches, connections), not kept
            for r in range(args.rounds):
                rounds.append(one_round(servers, kinds if r % 2 == 0 else kinds[::-1], r, n1, n32, nb, h2load))
        finally:
            for srv in servers.values():
                stop(srv.proc)
    summary = summarize(rounds)
    print(json.dumps({"ratio_to_current_median": summary}, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
