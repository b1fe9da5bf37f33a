"""What a PostgreSQL on the same 2 cores costs single Select, with and without recsvc's client side.

The target for single Select with the PostgreSQL ledger is 0.8x single Select with SQLite,
both on this machine. This benchmark separates the two things the PostgreSQL ledger adds: the
database's own work (parse-free prepared statements, locks, WAL flushes, backends waking on the
shared cores) and recsvc's side of it (psycopg, the rounds' queue). Each turn measures, one right
after the other, single Select with item ids, rnm, n = 500, concurrency 32, against one
``recsvc serve --workers 2`` per store (as ``scripts.bench.service --batch``), python grpc.aio client:

* ``sqlite``: the SQLite ledger alone;
* ``sqlite + db R/s``: the same SQLite server while a second PostgreSQL cluster on the same cores
  commits about R write transactions per second (pgbench, 2 connections; each transaction stores
  3 rows shaped like recsvc's stored answers, ``synchronous_commit = on``). That is the
  database's work without any of recsvc's client side: the SQLite server never talks to it;
* ``postgresql``: the PostgreSQL ledger (its own throwaway cluster).

Each row reports selections/s, the busy database's CPU in cores and its commits per second. The
summary gives each row over ``sqlite`` turn by turn, and the medians. Choose R so that the
``sqlite + db`` row's database CPU matches the ``postgresql`` row's: the ratio of that row is what
a PostgreSQL ledger with a free client side would reach on this machine.

    .venv/bin/python -m scripts.bench.pg_share --turns 5 --rates 400,200 [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from scripts.bench.harness import (
    METHOD,
    Cluster,
    bench_artifact,
    db_cpu_seconds,
    load,
    select_bodies,
    start_server,
    stop,
    throwaway_cluster,
    tree_cpu_seconds,
)

SELECTS = 3000  # per row and turn: about 2-3 s
# One pgbench transaction: 3 rows like recsvc_requests' (two hex ids, a 16-byte fingerprint, a
# 64-byte answer), committed durably.
LOAD_SQL = (
    "INSERT INTO answers(u, q, f, e, r, m) SELECT md5(random()::text), md5(random()::text), "
    "decode(md5(random()::text), 'hex'), 1, decode(repeat(md5(random()::text), 4), 'hex'), 'rnm' "
    "FROM generate_series(1, 3);\n"
)


def commits(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None  # the current database's own row
    return int(row[0])


def load_cluster(stack: ExitStack) -> tuple[Cluster, str, Path]:  # (cluster, url, script path)
    """The second cluster, busy only while a ``sqlite + db`` row runs."""
    import psycopg

    cluster = throwaway_cluster(stack, shared_buffers="128MB")
    url = cluster.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE answers (u text, q text, f bytea, e bigint, r bytea, m text, "
            "created timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (u, q))"
        )
    script = cluster.data / "load.sql"  # in the cluster's directory: readable by postgres
    script.write_text(LOAD_SQL)
    script.chmod(0o644)
    return cluster, url, script


def row(name: str, port: int, turn: int, db_cpu, db_url: str | None) -> dict:
    """One measured row; ``db_cpu()``: the busy database's CPU seconds so far (None: no database)."""
    c0, x0 = (db_cpu(), commits(db_url)) if db_url else (0.0, 0)
    r = asyncio.run(load(port, select_bodies(SELECTS, 100 + turn, "ids"), 32, channels=8, method=METHOD))
    elapsed = SELECTS / r["qps"]
    cores, per_s = ((db_cpu() - c0) / elapsed, (commits(db_url) - x0) / elapsed) if db_url else (0.0, 0.0)
    out = {
        "row": name,
        "turn": turn,
        "qps": r["qps"],
        "p50_ms": r["p50_ms"],
        "db_cores": cores,
        "db_commits_per_s": per_s,
    }
    print(
        f"{name:18s} turn {turn}  {r['qps']:6.0f} sel/s  p50 {r['p50_ms']:5.1f} ms  database "
        f"{cores:4.2f} cores {per_s:5.0f} commits/s",
        flush=True,
    )
    return out


def summary(rows: list[dict]) -> dict:
    base = {r["turn"]: r["qps"] for r in rows if r["row"] == "sqlite"}
    out = {}
    for name in dict.fromkeys(r["row"] for r in rows if r["row"] != "sqlite"):
        ratios = [r["qps"] / base[r["turn"]] for r in rows if r["row"] == name]
        cores = [r["db_cores"] for r in rows if r["row"] == name]
        out[name] = {
            "over_sqlite": [round(x, 3) for x in ratios],
            "median": round(statistics.median(ratios), 3),
            "db_cores_median": round(statistics.median(cores), 3),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=5, help="turns over the rows (default 5)")
    ap.add_argument(
        "--rates", default="400,200", help="pgbench transactions/s of the sqlite + db rows (default 400,200)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and the summary here")
    args = ap.parse_args()
    try:
        rates = [int(x) for x in args.rates.split(",")]
        if args.turns < 1 or not rates or min(rates) < 1:
            raise ValueError
    except ValueError:
        ap.error(
            f"--turns must be >= 1 and --rates positive integers separated by commas, got {args.turns} and "
            f"{args.rates!r}"
        )
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as td, ExitStack() as stack:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")
        sqlite = start_server("sqlite", art, tmp, 2, stack)
        stack.callback(sqlite.stop)
        pg = start_server("postgresql", art, tmp, 2, stack)
        stack.callback(pg.stop)
        cluster, url, script = load_cluster(stack)
        for srv in (sqlite, pg):  # warm up: connections, prepared statements, caches
            asyncio.run(load(srv.port, select_bodies(1000, 9, "ids"), 32, channels=8, method=METHOD))
        for turn in range(args.turns):
            rows.append(row("sqlite", sqlite.port, turn, None, None))
            for rate in rates:
                bench = cluster.spawn(
                    "pgbench",
                    "-n",
                    "-c",
                    "2",
                    "-j",
                    "1",
                    "-R",
                    str(rate),
                    "-T",
                    "600",
                    "-f",
                    str(script),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(cluster.port),
                    "-U",
                    "postgres",
                    url.rsplit("/", 1)[1],
                )
                try:
                    time.sleep(1.0)  # connected and at its rate
                    if bench.poll() is not None:
                        assert bench.stdout is not None  # spawn's stdout=PIPE
                        raise RuntimeError(f"pgbench ended: {bench.stdout.read()[-500:]}")
                    rows.append(
                        row(
                            f"sqlite + db {rate}/s",
                            sqlite.port,
                            turn,
                            lambda: tree_cpu_seconds(cluster.postmaster_pid()),
                            url,
                        )
                    )
                finally:
                    stop(bench)
            rows.append(row("postgresql", pg.port, turn, lambda: db_cpu_seconds(pg), pg.ledger_target))
    sums = summary(rows)
    for name, s in sums.items():
        print(
            f"{name:18s} over sqlite: median {s['median']:.2f} (turns {s['over_sqlite']}), "
            f"database {s['db_cores_median']:.2f} cores"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": sums}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
