"""An innocent user's latency while other clients flood the server with `rs` at the smallest γ.

Random stopping makes about 1/γ draws per selection (γ ≥ the `gamma` ParamSpec floor, 1e-6:
≈ 10⁶ draws, tens of ms of CPU each, with a geometric tail). The question is whether those
draws delay OTHER users' requests: a group-commit leader that drew every queued sample while
holding the ledger's cross-process write lock would make one innocent request wait behind a whole
batch of floods.

One real `recsvc serve` process (1 worker, default threads) on the synthetic artifact of
:mod:`scripts.bench.harness`. ``--flooders`` clients (default 8, each its own connection and user)
send `rs` at γ = the floor back to back, 500 candidates, ε = 0.001, a fresh request_id each.
Meanwhile one innocent user sends ``--requests`` `rnm` requests (500 candidates) one at a time,
``--gap-ms`` apart, on its own connection; we report its p50 / p99 / max latency, alone and under
the flood, and how many flood requests the server answered per second.

Usage: ``.venv/bin/python -m scripts.bench.rs_flood [--requests 400] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scripts.bench.harness import METHOD, Server, bench_artifact, payloads

if TYPE_CHECKING:
    from recsvc.v1 import selection_pb2 as pb


def smallest_gamma() -> float:
    from recsvc.mechanisms import MECHANISMS

    floor = MECHANISMS["rs"].params["gamma"].floor
    assert floor is not None
    return float(floor)


def _body(mechanism: str, user: str, seed: int, gamma: float | None = None) -> bytes:
    from recsvc.v1 import selection_pb2 as pb

    req = pb.SelectRequest.FromString(payloads(1, mechanism, seed=seed)[0])
    req.user_id = user
    if gamma is not None:
        req.gamma = gamma
    return req.SerializeToString()


def _fresh(template: pb.SelectRequest) -> bytes:
    template.request_id = uuid.uuid4().hex
    return template.SerializeToString()


def flood(port: int, clients: int, gamma: float, stop: Event, counter: Synchronized[int]) -> None:
    """``clients`` concurrent rs callers, each on its own connection, until ``stop`` is set."""
    import asyncio

    import grpc

    from recsvc.v1 import selection_pb2 as pb

    async def one(k: int) -> None:
        template = pb.SelectRequest.FromString(_body("rs", f"flood-{k}", seed=100 + k, gamma=gamma))
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as chan:
            call = chan.unary_unary(METHOD)
            while not stop.is_set():
                await call(_fresh(template), timeout=60)
                with counter.get_lock():
                    counter.value += 1

    async def main() -> None:
        await asyncio.gather(*(one(k) for k in range(clients)))

    asyncio.run(main())


def innocent(port: int, n: int, gap_s: float) -> np.ndarray:
    """Latencies (ms) of n sequential rnm requests of one user, on its own connection."""
    import grpc

    from recsvc.v1 import selection_pb2 as pb

    template = pb.SelectRequest.FromString(_body("rnm", "innocent", seed=7))
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as chan:
        call = chan.unary_unary(METHOD)
        for _ in range(5):  # warm up the connection and the server's thread
            call(_fresh(template), timeout=60)
        out = np.empty(n)
        for i in range(n):
            body = _fresh(template)
            t = time.perf_counter()
            call(body, timeout=60)
            out[i] = (time.perf_counter() - t) * 1e3
            time.sleep(gap_s)
    return out


def stats(lat: np.ndarray) -> dict[str, float]:
    return {
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "requests": int(lat.size),
    }


def run(requests: int, flooders: int, gap_ms: float, serve_flags: tuple[str, ...] = ()) -> dict:
    gamma = smallest_gamma()
    out: dict = {
        "gamma": gamma,
        "flooders": flooders,
        "innocent_requests": requests,
        "gap_ms": gap_ms,
        "serve_flags": list(serve_flags),
    }
    with tempfile.TemporaryDirectory(prefix="bench-rs-flood-") as td:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")
        srv = Server("sync", art, tmp, extra=serve_flags)
        try:
            out["alone"] = stats(innocent(srv.port, requests, gap_ms / 1e3))
            print(json.dumps({"alone": out["alone"]}), flush=True)
            ctx = mp.get_context("spawn")
            stop, counter = ctx.Event(), ctx.Value("l", 0)
            proc = ctx.Process(target=flood, args=(srv.port, flooders, gamma, stop, counter), daemon=True)
            proc.start()
            time.sleep(3.0)  # let the flood reach a steady state
            c0, cpu0, t0 = counter.value, srv.cpu_seconds(), time.perf_counter()
            lat = innocent(srv.port, requests, gap_ms / 1e3)
            wall = time.perf_counter() - t0
            out["flooded"] = {
                **stats(lat),
                "flood_qps": (counter.value - c0) / wall,
                "server_cores_busy": (srv.cpu_seconds() - cpu0) / wall,
            }
            print(json.dumps({"flooded": out["flooded"]}), flush=True)
            stop.set()
            proc.join(120)
            if proc.is_alive():
                proc.kill()
        finally:
            srv.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400, help="innocent requests per phase (default 400)")
    ap.add_argument("--flooders", type=int, default=8, help="concurrent rs clients (default 8)")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="pause between innocent requests (default 10)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--serve-flags", default="", help="extra `recsvc serve` flags, e.g. '--heavy-draw-threads 2'")
    args = ap.parse_args()
    res = run(args.requests, args.flooders, args.gap_ms, tuple(args.serve_flags.split()))
    print(json.dumps(res, indent=2))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
