"""Benchmark of the PrivateSelection service on loopback (bounded run time).

Measures, in ONE run so that ratios are comparable on a noisy machine:

* QPS and p50/p99 latency of Select at concurrency 1 and 32, 500 candidates per request,
  for ``rnm``, ``mgem`` and ``auto``, against the real server (durable SQLite ledger);
* the same payload against a no-op echo server (parses the request, answers a fixed item);
* the sync (thread-pool) server vs ``grpc.aio``: an aio no-op server (the most any aio server
  can do) and an aio server running the same servicer code on its event loop;
* ``--workers 2`` vs ``--workers 1`` throughput at concurrency 32, with the same client
  (same connections, same payloads) in both runs.

Two load generators, both in every run:

* ``h2load`` (nghttp2-client, C): ≈ 40 µs of client CPU per request, so on this 2-core machine
  the client does not compete with the server for the cores. It sends one pre-framed request
  body per run with an empty request_id (the server assigns a fresh one, so every request is a
  new charge, none a replay); after each run against a real server the benchmark checks with
  GetBudget that the ledger charged exactly that many requests (h2load itself only sees HTTP
  status 200, not the gRPC status). The targets are judged on these rows.
* ``python``: an asyncio ``grpc.aio`` client sending pre-serialised requests, each with its own
  request_id and one of 1,000 users; ≈ 250 µs of client CPU per request, reported for
  comparison with earlier runs.

Every server runs in its own process. Every row also reports the CPU time the server processes
and the client used per request, and the cores they used together (QPS × CPU per request), so a
reader can see when a run is against the machine's ceiling (all cores busy).
Usage: ``.venv/bin/python -m scripts.bench.service [--quick] [--json out.json]``;
``--batch [--workers N] [--ledger sqlite,postgresql]``: SelectBatch (100 rnm items of 500 candidates
per batch) vs single Select in selections/s, same server and run (python client;
:mod:`scripts.bench.service_batch`).
(``apt-get install nghttp2-client`` for h2load; without it only the python rows are measured).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scripts.bench.harness import METHOD, N_CANDIDATES, Server, bench_artifact, children_cpu, load, payloads

if TYPE_CHECKING:
    from recsvc.v1 import selection_pb2 as pb

MODULE = "scripts.bench.service"  # run again, as a subprocess, to serve the echo and aio servers


# ----------------------------------------------------------------------------- servers


def _echo(req: pb.SelectRequest) -> pb.SelectResponse:
    from recsvc.v1 import selection_pb2 as pb

    first = req.item_ids[0] if len(req.item_ids) else req.candidates[0].item_id
    return pb.SelectResponse(
        item_id=first, mechanism=req.mechanism, epsilon_spent=req.epsilon, request_id=req.request_id
    )


def _select_handler(fn: object) -> object:
    import grpc

    from recsvc.v1 import selection_pb2 as pb

    return grpc.method_handlers_generic_handler(
        "recsvc.v1.PrivateSelection",
        {
            "Select": grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=pb.SelectRequest.FromString,
                response_serializer=pb.SelectResponse.SerializeToString,
            )
        },
    )


def serve_echo(port: int) -> None:
    """No-op server on the shipped server's stack (sync, 16 threads): parse, answer the first item."""
    from concurrent import futures

    import grpc

    handler = _select_handler(lambda req, _ctx: _echo(req))
    server = grpc.server(futures.ThreadPoolExecutor(16), handlers=[handler], options=[("grpc.so_reuseport", 0)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    gc.freeze()  # as `recsvc serve` does: no full collection over the startup objects mid-run
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


def serve_aio(port: int, artifacts: str, ledger: str, echo: bool = False) -> None:
    """A grpc.aio server: the same SelectionServicer code on its event loop, or (echo) a no-op."""
    import grpc

    from recsvc.artifact import load_artifact
    from recsvc.ledger.sqlite import SQLiteLedger
    from recsvc.service.config import SelectorConfig
    from recsvc.service.interceptors import status_of
    from recsvc.service.servicer import SelectionServicer

    servicer = (
        None if echo else SelectionServicer(load_artifact(artifacts), SQLiteLedger(ledger, 1e6), SelectorConfig())
    )

    async def select(req: pb.SelectRequest, ctx: grpc.aio.ServicerContext) -> pb.SelectResponse:
        if servicer is None:
            return _echo(req)
        try:  # runs on the event loop: the work is CPU + a short SQLite commit
            return servicer.answer(servicer.prepare_select(req))
        except Exception as exc:
            await ctx.abort(*status_of(exc))
            raise  # not reached: abort raises (grpc is untyped here, so the checker cannot know)

    async def main() -> None:
        server = grpc.aio.server(handlers=[_select_handler(select)], options=[("grpc.so_reuseport", 0)])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        gc.freeze()  # as `recsvc serve` does: no full collection over the startup objects mid-run
        print(f"listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


class BenchServer(Server):
    """``recsvc serve`` (kind ``sync``) or one of this module's comparison servers (``echo``,
    ``aio-echo``, ``aio``) in its own process."""

    def command(self, artifacts: Path, extra: tuple[str, ...]) -> list[str]:
        if self.kind == "sync":
            return super().command(artifacts, extra)
        return [sys.executable, "-m", MODULE, f"--serve-{self.kind}", str(self.port), str(artifacts), str(self.ledger)]


# ----------------------------------------------------------------------------- client


def h2load_run(port: int, body: bytes, n: int, concurrency: int, tmp: Path) -> dict[str, float]:
    """n requests of one body over `concurrency` HTTP/2 connections (one stream each)."""
    framed = tmp / "h2load-body.bin"
    framed.write_bytes(b"\0" + len(body).to_bytes(4, "big") + body)  # gRPC length-prefixed message
    log = tmp / "h2load.log"
    log.unlink(missing_ok=True)  # h2load appends
    cmd = [
        "h2load",
        "-n",
        str(n),
        "-c",
        str(concurrency),
        "-m",
        "1",
        "-d",
        str(framed),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"--log-file={log}",
        f"http://127.0.0.1:{port}{METHOD}",
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    rows = np.loadtxt(log, dtype=np.int64, ndmin=2)
    if not re.search(rf"{n} succeeded, 0 failed, 0 errored", out) or rows.shape[0] != n or (rows[:, 1] != 200).any():
        raise RuntimeError(f"h2load did not complete {n} requests cleanly:\n{out}")
    first, last = rows[:, 0].min(), (rows[:, 0] + rows[:, 2]).max()  # µs since epoch
    lat = rows[:, 2] / 1e3
    return {
        "qps": n / ((last - first) / 1e6),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "requests": n,
        "wall_s": wall,
    }


def h2load_body(mechanism: str, user_id: str, seed: int) -> bytes:
    """One SelectRequest with an EMPTY request_id: the server gives each copy a fresh one."""
    from recsvc.v1 import selection_pb2 as pb

    req = pb.SelectRequest.FromString(payloads(1, mechanism, seed=seed)[0])
    req.user_id, req.request_id = user_id, ""
    return req.SerializeToString()


def charged(ledger: Path, user_id: str) -> int:
    """Requests the server's ledger has charged to user_id (read straight from the file)."""
    import sqlite3

    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT requests FROM budgets WHERE user_id=?", (user_id,)).fetchone()
    return 0 if row is None else int(row[0])


def run(quick: bool, clients: tuple[str, ...]) -> dict:
    n1, n32 = (300, 1000) if quick else (1500, 4000)
    results: dict = {"n_candidates": N_CANDIDATES, "cpus": os.cpu_count(), "clients": list(clients), "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-service-") as td:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")

        def one(srv: Server, kind: str, client: str, mech: str, conc: int, encoding: str, channels: int) -> dict:
            n = n1 if conc == 1 else n32
            seed = len(results["runs"])
            if client == "h2load":
                user = f"h2load-{seed}"
                body = h2load_body(mech, user, seed)
                h2load_run(srv.port, body, 20, 1, tmp)  # warm-up (its own charges, counted below)
                before = charged(srv.ledger, user) if srv.ledger.exists() else 0
                server0, client0 = srv.cpu_seconds(), children_cpu()
                r = h2load_run(srv.port, body, n, conc, tmp)
                server_us = (srv.cpu_seconds() - server0) / n * 1e6
                client_us = (children_cpu() - client0) / n * 1e6
                if kind in ("sync", "aio") and charged(srv.ledger, user) - before != n:
                    raise RuntimeError(f"the ledger charged {charged(srv.ledger, user) - before} of {n} requests")
            else:
                bodies = payloads(n, mech, seed=seed, encoding=encoding)
                server0, client0 = srv.cpu_seconds(), time.process_time()
                r = asyncio.run(load(srv.port, bodies, conc, channels=channels))
                server_us = (srv.cpu_seconds() - server0) / n * 1e6
                client_us = (time.process_time() - client0) / n * 1e6
            return {
                "server": kind,
                "workers": srv.workers,
                "client": client,
                "mechanism": mech,
                "concurrency": conc,
                "encoding": encoding,
                **r,
                "server_cpu_us": server_us,
                "client_cpu_us": client_us,
                "cores_used": r["qps"] * (server_us + client_us) / 1e6,
            }

        def measure(
            kind: str,
            mechanisms: list[str],
            workers: int = 1,
            concurrencies=(1, 32),
            encoding: str = "columns",
            channels: int = 4,
            only: tuple[str, ...] | None = None,
        ) -> None:
            srv = BenchServer(kind, art, tmp, workers)
            try:
                for client in only or clients:
                    for mech in mechanisms:
                        for conc in concurrencies:
                            row = one(srv, kind, client, mech, conc, encoding, channels)
                            results["runs"].append(row)
                            print(json.dumps(row), flush=True)
            finally:
                srv.stop()

        measure("echo", ["rnm"])
        measure("sync", ["rnm", "mgem", "auto"])
        measure("sync", ["rnm"], encoding="candidates", only=("python",))  # h2load sends columns only
        measure("aio-echo", ["rnm"])
        measure("aio", ["rnm", "mgem"])
        measure("echo", ["rnm"], concurrencies=(32,))  # echo again: drift check within the run
        # Workers: the same client (8 python channels or 32 h2load connections, so SO_REUSEPORT
        # can spread them) in every run, alternated 1, 2, 1, 2 so that a drift of the shared
        # machine's speed hits both alike.
        for _ in range(2):
            measure("sync", ["rnm"], workers=1, concurrencies=(32,), channels=8)
            measure("sync", ["rnm"], workers=2, concurrencies=(32,), channels=8)
    results["summary"] = {c: summary(results["runs"], c) for c in clients}
    print(json.dumps(results["summary"], indent=2), flush=True)
    return results


def summary(runs: list[dict], client: str) -> dict:
    """The ratios the targets are stated in, all from this run and this client."""

    def rows(server: str, mech: str = "rnm", conc: int = 32, workers: int = 1, encoding: str = "columns") -> list[dict]:
        return [
            r
            for r in runs
            if (r["server"], r["mechanism"], r["concurrency"], r["workers"], r["encoding"], r["client"])
            == (server, mech, conc, workers, encoding, client)
        ]

    def row(server: str, mech: str = "rnm", conc: int = 32, workers: int = 1, encoding: str = "columns") -> dict:
        return rows(server, mech, conc, workers, encoding)[0]

    echo32 = row("echo")["qps"]
    one, two = rows("sync", workers=1)[-2:], rows("sync", workers=2)
    return {
        "p99_ms_c1": {m: row("sync", m, 1)["p99_ms"] for m in ("rnm", "mgem", "auto")},
        "echo_p99_ms_c1": row("echo", conc=1)["p99_ms"],
        "qps_ratio_to_echo_c32": {m: row("sync", m)["qps"] / echo32 for m in ("rnm", "mgem", "auto")},
        "echo_drift_c32": rows("echo")[-1]["qps"] / echo32,
        "workers2_over_workers1": sum(r["qps"] for r in two) / sum(r["qps"] for r in one),
        "workers_pairs_qps": [(a["qps"], b["qps"]) for a, b in zip(one, two, strict=False)],
        # The machine has few cores: a run that keeps them all busy cannot go faster.
        "workers_pairs_cores_used": [(a["cores_used"], b["cores_used"]) for a, b in zip(one, two, strict=False)],
        "sync_over_aio_c32": {m: row("sync", m)["qps"] / row("aio", m)["qps"] for m in ("rnm", "mgem")},
        "aio_echo_over_echo_c32": row("aio-echo")["qps"] / echo32,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-echo":
        serve_echo(int(sys.argv[2]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] in ("--serve-aio", "--serve-aio-echo"):
        serve_aio(int(sys.argv[2]), sys.argv[3], sys.argv[4], echo=sys.argv[1] == "--serve-aio-echo")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--batch", action="store_true", help="only SelectBatch (100 rnm items/batch) vs single Select, python client"
    )
    ap.add_argument("--workers", type=int, default=1, help="server worker processes for --batch (default 1)")
    ap.add_argument(
        "--ledger",
        default="sqlite",
        help="--batch: ledger stores to measure, comma-separated: sqlite and/or postgresql "
        "(a throwaway cluster on loopback; default sqlite)",
    )
    ap.add_argument(
        "--passes",
        type=int,
        default=2,
        help="--batch: passes over the plan (default 2); the stores take turns row by row",
    )
    ap.add_argument(
        "--clients", default="h2load,python", help="load generators, comma-separated (default: h2load,python)"
    )
    args = ap.parse_args()
    if args.batch:
        from scripts.bench.service_batch import run_batch

        ledgers = tuple(x for x in args.ledger.split(",") if x)
        if not ledgers or set(ledgers) - {"sqlite", "postgresql"}:
            ap.error(f"--ledger must name sqlite and/or postgresql, got {args.ledger!r}")
        if args.passes < 1:
            ap.error(f"--passes must be >= 1, got {args.passes}")
        res = run_batch(args.quick, args.workers, ledgers, passes=args.passes)
        if args.json:
            args.json.write_text(json.dumps(res, indent=2))
        return 0
    clients = tuple(c for c in args.clients.split(",") if c)
    if not clients or set(clients) - {"h2load", "python"}:
        ap.error(f"--clients must name h2load and/or python, got {args.clients!r}")
    if "h2load" in clients and shutil.which("h2load") is None:
        print(
            "h2load not found (apt-get install nghttp2-client): measuring with the python client only", file=sys.stderr
        )
        clients = tuple(c for c in clients if c != "h2load") or ("python",)
    res = run(args.quick, clients)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
