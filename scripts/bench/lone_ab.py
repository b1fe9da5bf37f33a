"""Lone Select p50, this code against another checkout, with each server started first in turn.

Both servers are `recsvc serve --workers 1` on one benchmark artifact, each with its own durable
SQLite ledger in a temporary directory; the other tree's runs with that tree first on PYTHONPATH.
Each run sends ``--calls`` fresh rnm Selects (500 candidates by id) to each server, alternating
call by call and reversing the order every call, after 200 warm-up calls each. Runs alternate
which server is started first: the server started first measures a little slower (about 0.5 %
on this host), so a ratio is only trustworthy over both orders. ``--same`` runs this code against
itself, the noise floor. Reports each run's before ÷ this code p50 ratio and their median.

Usage: ``.venv/bin/python -m scripts.bench.lone_ab --before /tmp/old [--calls 2000] [--runs 4] [--same]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from scripts.bench.harness import METHOD, REPO, bench_artifact, free_port, launch, select_bodies, serve_command


def run(trees: dict[str, Path], first: str, calls: int, art: Path, tmp: Path, seed: int) -> dict[str, float]:
    """One run: the servers started in the order ``first`` then the other; each one's p50 in µs."""
    order = [first, *(n for n in trees if n != first)]
    procs, stubs = [], {}
    try:
        for name in order:
            port = free_port()
            env = dict(os.environ, PYTHONPATH=str(trees[name]))
            cmd = serve_command(art, tmp / f"{name}-{seed}.db", port, "--workers", "1", "--drain-delay", "0")
            procs.append(launch(cmd, name, cwd=trees[name], env=env))
            stubs[name] = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(METHOD)
        bodies = iter(select_bodies(2 * (calls + 200), seed, "ids"))
        for stub in stubs.values():
            for _ in range(200):
                stub(next(bodies))
        lat: dict[str, list[float]] = {n: [] for n in trees}
        names = list(trees)
        for i in range(calls):
            for name in names if i % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                stubs[name](next(bodies))
                lat[name].append(time.perf_counter() - t0)
        return {n: statistics.median(v) * 1e6 for n, v in lat.items()}
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="the other checkout (git worktree add /tmp/old <commit>)")
    ap.add_argument("--calls", type=int, default=2000, help="lone Selects per server per run (default 2000)")
    ap.add_argument("--runs", type=int, default=4, help="runs, alternating which server starts first (default 4)")
    ap.add_argument("--same", action="store_true", help="this code against itself (the noise floor)")
    args = ap.parse_args()
    if args.before is None and not args.same:
        ap.error("give --before DIR (a checkout to compare with) or --same")
    if args.calls < 1 or args.runs < 1:
        ap.error("--calls and --runs must be >= 1")
    trees = {"this": REPO, "before": REPO if args.same else args.before.resolve()}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="lone-ab-") as td:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")
        for r in range(args.runs):
            first = "this" if r % 2 == 0 else "before"
            p50 = run(trees, first, args.calls, art, tmp, seed=r)
            ratios.append(p50["before"] / p50["this"])
            print(
                f"run {r}: {first} started first; p50 this {p50['this']:.1f} µs, before {p50['before']:.1f} µs; "
                f"before ÷ this {ratios[-1]:.3f}",
                flush=True,
            )
    print(f"before ÷ this code, lone Select p50: median {statistics.median(ratios):.3f} over {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
