"""Recommend latency over a full catalog: p50/p99 at concurrency 1 (bounded run time).

Starts `recsvc serve` on an artifact in its own process (durable SQLite ledger in a temp dir) and
sends Recommend requests one at a time over loopback, each with a fresh request_id (every request
is a new charge, none a replay). Histories are random catalog items, their lengths drawn around
the ml20m-shape mean (≈ 74 interactions per user). Rows: the default (one item, `auto`), rnm,
10-item slates (`auto`, which peels mgem natively over the full catalog on ml20m-shape, and
each one-shot mechanism), and the two-stage path (a private top-500 at half of ε drawn by each one-shot
mechanism, then `auto` among the 500). Also times the server's steps in-process (SANSA scoring,
clipping, the selection) so a reader sees where the time goes.

Usage: .venv/bin/python -m scripts.bench.recommend [--artifacts artifacts/synthetic-ml20m-shape]
       [--requests 2000] [--against-float] [--serve-args "..."]    (targets on ml20m-shape: p99 ≤ 10 ms for the default row and for a
       k = 10 slate; ≤ 10 ms per call for two-stage m = 500)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.harness import REPO, free_port, launch, serve_command

MEAN_HISTORY = 74
ONE_SHOT = ("oneshot", "gumbel", "clm")


def histories(item_ids: list[str], count: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(MEAN_HISTORY) - 0.5, 1.0, count).astype(int), 5, 2000)
    return [[item_ids[i] for i in rng.choice(len(item_ids), n, replace=False)] for n in lengths]


def measure(clients: list[Any], hist: list[list[str]], requests: int, **kwargs: Any) -> np.ndarray:
    """Latencies (s), one row per client: each request goes to every client in turn, the order
    reversed every request, so a drifting host load falls on all alike."""
    out = np.empty((len(clients), requests))
    for i in range(requests):
        h = hist[i % len(hist)]
        for j in range(len(clients)) if i % 2 == 0 else reversed(range(len(clients))):
            t0 = time.perf_counter()
            clients[j].recommend(f"user{i % 1000}", h, request_id=uuid.uuid4().hex, **kwargs)
            out[j, i] = time.perf_counter() - t0
    return out


def steps(artifacts: Path, hist: list[list[str]], calls: int = 200) -> None:
    """In-process: the median time of each step of one Recommend (no gRPC, no ledger)."""
    from recsvc.artifact import load_artifact
    from recsvc.mechanisms import select
    from recsvc.rng import csprng
    from recsvc.service.selection import Catalog, Recommender

    art = load_artifact(artifacts)
    cat = Catalog(art)
    rec = Recommender(art, cat)
    g = csprng()
    score_t: list[float] = []
    clip_t: list[float] = []
    sel_t: dict[str, list[float]] = {"rnm": [], "mgem": []}
    for i in range(calls):
        t0 = time.perf_counter()
        raw = rec.scores(hist[i % len(hist)])
        t1 = time.perf_counter()
        q = np.clip(raw, cat.lo, cat.hi)
        t2 = time.perf_counter()
        score_t.append(t1 - t0)
        clip_t.append(t2 - t1)
        for name in sel_t:
            t3 = time.perf_counter()
            select(name, q, cat.sensitivity, 1.0, rng=g)
            sel_t[name].append(time.perf_counter() - t3)
    med = {
        k: float(np.median(v)) * 1e3
        for k, v in {"SANSA scoring": score_t, "clip": clip_t, **{f"select {k}": v for k, v in sel_t.items()}}.items()
    }
    print("in-process medians (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=REPO / "artifacts" / "synthetic-ml20m-shape")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--two-stage-requests", type=int, default=500)
    ap.add_argument(
        "--against-float",
        action="store_true",
        help="also serve the float64 samplers issue 36 replaced (scripts/bench/float_samplers.py), "
        "requests alternating between the two servers, and report exact ÷ float",
    )
    ap.add_argument(
        "--serve-args",
        default="",
        help="extra `recsvc serve` flags, one string (e.g. '--heavy-draws 250000'); default: none",
    )
    args = ap.parse_args()
    if not args.artifacts.is_dir():
        ap.error(
            f"no artifact at {args.artifacts}: build the default one with `.venv/bin/recsvc prep "
            "--dataset synthetic --preset ml20m-shape --out artifacts/synthetic-ml20m-shape` (as "
            "python -m scripts.bench.pipeline does), or pass --artifacts artifacts/ml-100k after "
            "`bash scripts/demo.sh`"
        )

    from recsvc.artifact import load_artifact
    from recsvc.service.client import Client

    art = load_artifact(args.artifacts)
    ids = art.items["item_id"].to_list()
    hist = histories(ids, 500)
    print(
        f"artifact {args.artifacts}: {len(ids)} items; histories of mean length "
        f"{np.mean([len(h) for h in hist]):.0f}; concurrency 1, loopback, durable SQLite ledger"
    )
    steps(args.artifacts, hist)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        clients = []
        for side in ("exact", "float") if args.against_float else ("exact",):
            port = free_port()
            cmd = serve_command(args.artifacts, Path(tmp) / f"ledger-{side}.db", port, *args.serve_args.split())
            if side == "float":  # the same server with the float samplers patched in first
                cmd = [sys.executable, "-m", "scripts.bench.transport", "--serve", "float-samplers", *cmd[3:]]
            proc = launch(cmd, f"{side} server")
            stack.callback(proc.wait, 30)
            stack.callback(proc.terminate)
            clients.append(stack.enter_context(Client(f"127.0.0.1:{port}", retries=0)))
        rows: list[tuple[str, dict[str, Any], int]] = [
            ("default (auto, 1 item)", {"epsilon": 1.0}, args.requests),
            ("rnm, 1 item", {"epsilon": 1.0, "mechanism": "rnm"}, args.requests),
            ("auto, k=10 slate (peeled)", {"epsilon": 1.0, "k": 10}, args.requests // 2),
        ]
        rows += [(f"{m}, k=10 slate", {"epsilon": 1.0, "k": 10, "mechanism": m}, args.requests // 2) for m in ONE_SHOT]
        two = {"epsilon": 1.0, "k": 10, "num_candidates": 500, "candidate_fraction": 0.5}
        rows += [
            (f"two-stage m=500 by {m}, k=10", {**two, "candidate_mechanism": m}, args.two_stage_requests)
            for m in ONE_SHOT
        ]
        head = f"{'row':<30} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        print(head + ("   float p50    p99   exact÷float p50  p99" if args.against_float else ""))
        for label, kwargs, n in rows:
            measure(clients, hist, min(20, n), **kwargs)  # warm-up (JIT, caches)
            lat = measure(clients, hist, n, **kwargs) * 1e3
            p50, p99 = np.percentile(lat, 50, axis=1), np.percentile(lat, 99, axis=1)
            line = f"{label:<30} {n:>8} {p50[0]:>8.2f} {p99[0]:>8.2f} {lat[0].max():>8.2f}"
            if args.against_float:
                line += f" {p50[1]:>11.2f} {p99[1]:>6.2f} {p50[0] / p50[1]:>16.2f} {p99[0] / p99[1]:>4.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
