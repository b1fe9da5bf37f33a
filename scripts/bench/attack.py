"""The second adversarial review's availability attacks at full size, against this checkout's
server ("new") and the server before it ("old": the merge base with ``main``, extracted with
``git archive``), in one run, together with their single-Select and SelectBatch speed.

Each server is a real ``recsvc serve`` process (default flags, ``--token-file``) on the
synthetic artifact of :mod:`scripts.bench.harness`, its ledger on tmpfs when there is one.

- **speed**: Select p50/p99 at concurrency 1 and QPS at concurrency 16 (500 candidates, rnm,
  Python ``grpc.aio`` load client); SelectBatch items/s (batches of 100, concurrency 4);
- **idle streams**: 16 anonymous Health/Watch streams, 200 anonymous header-only Selects over 4
  raw HTTP/2 connections and 32 anonymous slow bodies (3 bytes, then nothing), all at once; an
  authenticated caller then sends Selects one at a time (1 s deadline each): p99, errors, and
  the server's RSS growth;
- **heavy draws**: 40 callers with `user:` tokens send rs at γ = 1e-6, k = 20 back to back (from
  another process) from the moment the heavy queue is full until the innocent caller is done; its
  p99 and errors (5 s deadline each);
- in both attacks, the innocent caller's p50 and p99 **against the same server with no attack**,
  measured in the same run: its same Selects just before the attack and just after it, pooled
  (``p50_ratio``, ``p99_ratio``: attacked ÷ quiet). The tests assert no latency; this is where
  it is measured;
- **bytes in flight**: 40 concurrent SelectBatch messages of ≈ 13 MiB (`--max-batch 1600`); the
  server's peak RSS and the statuses.

Usage: ``.venv/bin/python -m scripts.bench.attack [--only new] [--json out.json]``;
``--side-by-side ROUNDS [--old REF]``: only the speed, old and new on fresh processes every round,
their lone Selects interleaved (:func:`side_by_side`), with the median of the rounds' new/old
ratios and the host's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import psutil

from scripts.bench.harness import (
    BATCH_METHOD,
    REPO,
    batch_bodies,
    bench_artifact,
    free_port,
    launch,
    load,
    select_bodies,
    serve_command,
    stop,
)

SELECT = "/recsvc.v1.PrivateSelection/Select"
WATCH = "/grpc.health.v1.Health/Watch"
HEAVY_ATTACKERS = 40


def old_checkout(tmp: Path, ref: str | None = None) -> Path:
    """``ref`` (default: the merge base with main) as files (no git metadata is written)."""
    if ref is None:
        base = subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=REPO, capture_output=True, text=True, check=True
        )
        ref = base.stdout.strip()
    out = tmp / "old"
    out.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


@contextmanager
def served(
    repo: Path, art: Path, tmp: Path, *extra: str, tokens: bool = True
) -> Iterator[tuple[int, subprocess.Popen]]:
    """``repo``'s `recsvc serve` with ``extra`` flags (and, with ``tokens``, a token file: the
    innocent caller's `service` token and the attackers' `user:` tokens)."""
    if tokens:
        path = tmp / "tokens"
        lines = ["innocent service"] + [f"atk{i} user:atk{i}" for i in range(HEAVY_ATTACKERS)]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        extra = ("--token-file", str(path), *extra)
    shm = Path("/dev/shm")
    ledger_dir = Path(tempfile.mkdtemp(dir=shm if shm.is_dir() else tmp))
    port = free_port()
    cmd = serve_command(art, ledger_dir / "l.db", port, *extra)
    proc = launch(cmd, f"recsvc serve ({repo})", cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        yield port, proc
    finally:
        stop(proc)
        shutil.rmtree(ledger_dir, ignore_errors=True)


def _metadata() -> tuple[tuple[str, str], ...]:
    return (("authorization", "Bearer innocent"),)


def speed(port: int) -> dict[str, float]:
    one = asyncio.run(load(port, select_bodies(300, 3, "ids"), 1, channels=1))
    many = asyncio.run(load(port, select_bodies(3000, 4, "ids"), 16))
    batches = asyncio.run(load(port, batch_bodies(40, 100, 5), 4, method=BATCH_METHOD))
    return {
        "select_p50_ms": one["p50_ms"],
        "select_p99_ms": one["p99_ms"],
        "select_qps_c16": many["qps"],
        "batch_items_per_s": batches["qps"] * 100,
    }


def innocent(port: int, n: int, deadline: float, gap: float = 0.005, warmup: int = 5) -> tuple[dict, list[float]]:
    """``n`` Selects one at a time over a fresh connection, after ``warmup`` unmeasured ones (the
    5th consecutive failure ends the run): p50/p99 of the answered ones and how many failed, and
    their latencies in seconds."""
    import grpc

    body = select_bodies(n + warmup, 9, "ids")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    call = channel.unary_unary(SELECT)
    lat, errors, streak = [], Counter[str](), 0
    for i, b in enumerate(body):
        t0 = time.perf_counter()
        try:
            call(b, metadata=_metadata(), timeout=deadline)
            if i >= warmup:
                lat.append(time.perf_counter() - t0)
            streak = 0
        except grpc.RpcError as exc:
            errors[exc.code().name] += 1
            streak += 1
            if streak >= 5:
                break
        time.sleep(gap)
    channel.close()
    return {"answered": len(lat), **_percentiles(lat), **{f"errors_{k}": v for k, v in errors.items()}}, lat


def _percentiles(lat: list[float], prefix: str = "") -> dict[str, float]:
    a = np.array(lat or [float("nan")]) * 1e3
    return {f"{prefix}p50_ms": float(np.percentile(a, 50)), f"{prefix}p99_ms": float(np.percentile(a, 99))}


def against_quiet(attacked: dict, quiet: list[float]) -> dict[str, float]:
    """``attacked``'s innocent p50/p99 with the same server's quiet ones (before and after the
    attack, pooled) and their ratios: what the attack costs an innocent caller, measured in one run."""
    calm = _percentiles(quiet, "quiet_")
    return {
        **attacked,
        **calm,
        "p50_ratio": attacked["p50_ms"] / calm["quiet_p50_ms"],
        "p99_ratio": attacked["p99_ms"] / calm["quiet_p99_ms"],
    }


INNOCENT_CALLS = 200


def idle_streams(port: int, pid: int) -> dict[str, float]:
    import grpc

    from recsvc.service.testing import RawStreams, grpc_frame, select_request

    _, before = innocent(port, INNOCENT_CALLS, 1.0)
    server = psutil.Process(pid)
    rss0 = server.memory_info().rss
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    watches = [channel.unary_stream(WATCH)(b"", timeout=60) for _ in range(16)]
    raw = [RawStreams(port) for _ in range(4)]
    for r in raw:
        for _ in range(50):
            r.open(SELECT)
    slow = RawStreams(port)
    body = grpc_frame(select_request("slow-user", "s").SerializeToString())
    for _ in range(32):
        slow.send(slow.open(SELECT), body[:3])
    time.sleep(0.5)
    out, _ = innocent(port, INNOCENT_CALLS, 1.0)
    out["rss_growth_mb"] = (server.memory_info().rss - rss0) / 2**20
    for w in watches:
        w.cancel()
    channel.close()
    for r in [*raw, slow]:
        r.close()
    _, after = innocent(port, INNOCENT_CALLS, 1.0)
    return against_quiet(out, before + after)


def heavy(port: int) -> dict[str, float]:
    from recsvc.service.testing import heavy_attack

    ctx = mp.get_context("spawn")
    results, stop, refused = ctx.Queue(), ctx.Event(), ctx.Event()
    tokens = [f"atk{i}" for i in range(HEAVY_ATTACKERS)]
    cands = [(f"item{k}", 0.5 + 0.01 * k) for k in range(20)]  # the bench artifact's ids
    _, before = innocent(port, INNOCENT_CALLS, 5.0)
    attackers = ctx.Process(
        target=heavy_attack,
        args=(f"127.0.0.1:{port}", tokens, 600.0, 0.02, 20, cands, results, stop, refused, 600.0),
    )
    attackers.start()
    full = refused.wait(60)  # a server without a heavy queue (the old one) never refuses: 60 s of attack then
    out, _ = innocent(port, INNOCENT_CALLS, 5.0)
    out["queue_full_first"] = full
    stop.set()
    total = sum((Counter(c) for c in results.get(timeout=900).values()), Counter())
    attackers.join(30)
    _, after = innocent(port, INNOCENT_CALLS, 5.0)
    return {**against_quiet(out, before + after), **{f"attackers_{k}": v for k, v in total.items()}}


def big_batches(port: int, pid: int) -> dict[str, float]:
    """40 concurrent SelectBatch messages of ≈ 13 MiB; the server's peak RSS while they run."""
    import grpc

    body = batch_bodies(1, 1500, 7)[0]
    server = psutil.Process(pid)
    rss0, peak, done = server.memory_info().rss, [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.memory_info().rss)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    channel = grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    )
    call = channel.unary_unary(BATCH_METHOD)
    futures = [call.future(body, metadata=_metadata(), timeout=300) for _ in range(40)]
    codes: Counter[str] = Counter()
    for f in futures:
        try:
            f.result()
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1
    done.set()
    watcher.join()
    channel.close()
    return {
        "message_mib": len(body) / 2**20,
        "rss_before_mib": rss0 / 2**20,
        "rss_peak_mib": peak[0] / 2**20,
        **{f"calls_{k}": v for k, v in codes.items()},
    }


PARTS = ("speed", "idle_streams", "heavy", "big_batches")


def side_by_side(kinds: dict[str, Path], art: Path, tmp: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Both servers measured in one run, ``rounds`` times, each round on freshly started
    processes (no tokens): a server process's own luck (its threads' placement on the cores,
    memory layout) moved the lone-call p50 of two identical servers by up to 10 %, so one process
    per kind for all rounds is not a comparison. In each round: Select p50 at concurrency 1 with
    the requests interleaved (one to each server in turn, the order reversed every request, so
    the host's load drifts over both alike); then QPS at concurrency 16 and SelectBatch items/s,
    the first server alternating between rounds."""
    out: dict[str, dict[str, list[float]]] = {
        k: {"p50_ms_c1": [], "qps_c16": [], "batch_items_per_s": []} for k in kinds
    }
    for r in range(rounds):
        with ExitStack() as stack:
            ports = {k: stack.enter_context(served(repo, art, tmp, tokens=False))[0] for k, repo in kinds.items()}
            lone = asyncio.run(interleaved(ports, select_bodies(LONE + LONE_WARMUP, r, "ids")))
            for k in kinds:
                out[k]["p50_ms_c1"].append(lone[k])
            for k in list(ports) if r % 2 == 0 else list(ports)[::-1]:
                port = ports[k]
                out[k]["qps_c16"].append(asyncio.run(load(port, select_bodies(1500, 100 + r, "ids"), 16))["qps"])
                batches = asyncio.run(load(port, batch_bodies(20, 100, 200 + r), 4, method=BATCH_METHOD))
                out[k]["batch_items_per_s"].append(batches["qps"] * 100)
    return out


LONE, LONE_WARMUP = 400, 30  # lone Selects per server and round, after this many unmeasured


async def interleaved(ports: dict[str, int], bodies: list[bytes]) -> dict[str, float]:
    """p50 (ms) of each server's lone Selects, sent one at a time to each server in turn over
    one connection per server (every server gets the same bodies: their ledgers are apart)."""
    import grpc

    chans = {
        k: grpc.aio.insecure_channel(f"127.0.0.1:{p}", options=[("grpc.use_local_subchannel_pool", 1)])
        for k, p in ports.items()
    }
    calls = {k: c.unary_unary(SELECT) for k, c in chans.items()}
    kinds = list(ports)
    latencies: dict[str, list[float]] = {k: [] for k in kinds}
    for i, body in enumerate(bodies):
        for k in kinds if i % 2 == 0 else kinds[::-1]:
            t = time.perf_counter()
            await calls[k](body)
            if i >= LONE_WARMUP:
                latencies[k].append(time.perf_counter() - t)
    for c in chans.values():
        await c.close()
    return {k: float(np.median(v) * 1e3) for k, v in latencies.items()}


def run(repo: Path, art: Path, tmp: Path, parts: tuple[str, ...] = PARTS) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if "speed" in parts:
        with served(repo, art, tmp, tokens=False) as (port, _proc):
            out["speed"] = speed(port)
    if "idle_streams" in parts:
        with served(repo, art, tmp) as (port, proc):
            out["idle_streams"] = idle_streams(port, proc.pid)
    if "heavy" in parts:
        with served(repo, art, tmp) as (port, _proc):
            out["heavy"] = heavy(port)
    if "big_batches" in parts:
        with served(repo, art, tmp, "--max-batch", "1600") as (port, proc):
            out["big_batches"] = big_batches(port, proc.pid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("old", "new"), help="measure one server only")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    ap.add_argument("--rounds", type=int, default=1, help="old and new alternated this many times")
    ap.add_argument(
        "--side-by-side",
        type=int,
        metavar="ROUNDS",
        help="only the speed: old and new up at once, fresh processes every round, lone Selects interleaved",
    )
    ap.add_argument("--old", metavar="REF", help="the commit to compare against (default: the merge base with main)")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        art = bench_artifact(tmp / "art")
        kinds = {"new": REPO} if args.only == "new" else {}
        if args.only != "new":
            kinds = {"old": old_checkout(tmp, args.old), **({"new": REPO} if args.only is None else {})}
        if args.side_by_side:
            load_before = os.getloadavg()
            both = side_by_side(kinds, art, tmp, args.side_by_side)
            for k, measures in both.items():
                medians = {m: round(float(np.median(v)), 3) for m, v in measures.items()}
                print(k, "medians", medians, "runs", {m: [round(x, 3) for x in v] for m, v in measures.items()})
            if len(both) == 2:
                ratios = {m: round(float(np.median(np.divide(both["new"][m], both["old"][m]))), 3) for m in both["new"]}
                print("new/old, median of the rounds' ratios", ratios)
                both["ratio_new_over_old"] = {m: [v] for m, v in ratios.items()}
            print("load average before", load_before, "after", os.getloadavg())
            results["side_by_side"] = both
            kinds = {}
        for r in range(args.rounds):
            for kind, repo in kinds.items():
                name = kind if args.rounds == 1 else f"{kind}-{r}"
                results[name] = run(repo, art, tmp, tuple(args.parts))
                print(name, json.dumps(results[name], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
