"""``python -m scripts.bench.service --batch``: SelectBatch vs single Select, one server per ledger.

Against one ``recsvc serve`` (durable ledger), n = 500 candidates, rnm, every request a fresh
charge, the python ``grpc.aio`` client with pre-serialised bodies; the plan runs twice (``--passes``)
and, with several stores, the stores take turns row by row, so a drift of the shared machine hits
them alike:

* single Select with item ids (what ``Client`` sends by default) at concurrency 8 and 32;
* single Select and SelectBatch (``size`` requests per batch) in the compact encoding (item rows +
  catalog version, README § "Compact encoding: item rows");
* SelectBatch with item ids.

``--ledger sqlite,postgresql`` measures each store in the same run (PostgreSQL: a throwaway cluster
on loopback, :func:`scripts.bench.harness.start_server`, prepared with ``recsvc ledger init``). The
summary compares the stores' best rows, and row by row (``paired``: the median of PostgreSQL over SQLite
for the same row of the same pass, measured one right after the other). After each row the
ledger is asked how many requests it charged: a row whose requests were not all charged is an
error, not a number.
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import ExitStack
from pathlib import Path

from scripts.bench.harness import (
    BATCH_METHOD,
    METHOD,
    Server,
    batch_bodies,
    bench_artifact,
    db_cpu_seconds,
    load,
    select_bodies,
    start_server,
)


def charged_total(ledger: str) -> int:
    """Requests the ledger has charged so far (read straight from its database)."""
    if ledger.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(ledger) as conn:
            row = conn.execute("SELECT count(*) FROM recsvc_requests").fetchone()
            assert row is not None  # an aggregate always returns its row
            return int(row[0])
    import sqlite3

    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT count(*) FROM requests").fetchone()[0])


PLAN = (
    ("Select", "ids", 8),
    ("Select", "ids", 32),
    ("Select", "rows", 8),
    ("Select", "rows", 32),
    ("SelectBatch", "rows", 4),
    ("SelectBatch", "rows", 8),
    ("SelectBatch", "ids", 8),
)


def measure(srv: Server, quick: bool, size: int, rep: int, ledger: str, kind: str, encoding: str, conc: int) -> dict:
    """One row of the plan against one server."""
    n_single, n_batches = (600, 30) if quick else (3000, 150)
    if kind == "Select":
        bodies, method, per = select_bodies(n_single, rep, encoding), METHOD, 1
    else:
        bodies, method, per = batch_bodies(n_batches, size, rep, encoding), BATCH_METHOD, size
    before, cpu0, db0 = charged_total(srv.ledger_target), srv.cpu_seconds(), db_cpu_seconds(srv)
    r = asyncio.run(load(srv.port, bodies, conc, channels=min(conc, 8), method=method))
    cpu, db_cpu = srv.cpu_seconds() - cpu0, db_cpu_seconds(srv) - db0
    got = charged_total(srv.ledger_target) - before
    warm = min(conc, 8) if kind == "Select" else 0  # Select's warm-up calls are fresh charges too
    if got != len(bodies) * per + warm:
        raise RuntimeError(f"{ledger} {kind}/{encoding}: the ledger charged {got} of {len(bodies) * per + warm}")
    row = {
        "ledger": ledger,
        "rpc": kind,
        "encoding": encoding,
        "concurrency": conc,
        "selections_per_s": r["qps"] * per,
        "rpcs_per_s": r["qps"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "server_cpu_us_per_selection": cpu / (len(bodies) * per) * 1e6,
        "db_cpu_us_per_selection": db_cpu / (len(bodies) * per) * 1e6,
    }
    print(json.dumps(row), flush=True)
    return row


def best(runs: list[dict], ledger: str, rpc: str, encoding: str) -> float:
    return max(r["selections_per_s"] for r in runs if (r["ledger"], r["rpc"], r["encoding"]) == (ledger, rpc, encoding))


def paired(runs: list[dict], rpc: str) -> list[float]:
    """PostgreSQL over SQLite, row by row: the two stores' measurements of the same plan row in the
    same pass, taken one right after the other, so a drift of the shared machine cancels out."""
    rows: dict[tuple, dict[str, float]] = {}
    for r in runs:
        rows.setdefault((r["pass"], r["rpc"], r["encoding"], r["concurrency"]), {})[r["ledger"]] = r["selections_per_s"]
    return [v["postgresql"] / v["sqlite"] for k, v in rows.items() if k[1] == rpc and len(v) == 2]


def run_batch(
    quick: bool, workers: int, ledgers: tuple[str, ...] = ("sqlite",), size: int = 100, passes: int = 2
) -> dict:
    """SelectBatch (``size`` rnm items of n = 500 per batch) vs single Select, same server, same run."""
    import statistics
    import tempfile

    results: dict = {
        "n_candidates": 500,
        "batch_size": size,
        "workers": workers,
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as td, ExitStack() as stack:
        tmp = Path(td)
        art = bench_artifact(tmp / "art")
        servers = {}
        for ledger in ledgers:
            servers[ledger] = start_server(ledger, art, tmp, workers, stack)
            stack.callback(servers[ledger].stop)  # before its database goes (LIFO)
        for rep in range(passes):  # the stores take turns row by row, so a drift of the machine hits them alike
            for kind, encoding, conc in PLAN:
                for ledger, srv in servers.items():
                    row = measure(srv, quick, size, rep, ledger, kind, encoding, conc)
                    results["runs"].append({**row, "pass": rep})
    summary: dict = {}
    for ledger in ledgers:
        single = best(results["runs"], ledger, "Select", "ids")
        batch = best(results["runs"], ledger, "SelectBatch", "rows")
        summary[ledger] = {
            "best_Select_ids": single,
            "best_Select_rows": best(results["runs"], ledger, "Select", "rows"),
            "best_SelectBatch_rows": batch,
            "best_SelectBatch_ids": best(results["runs"], ledger, "SelectBatch", "ids"),
            "batch_rows_over_single_ids": batch / single,
        }
    if {"sqlite", "postgresql"} <= set(ledgers):
        pg, lite = summary["postgresql"], summary["sqlite"]
        summary["pg_over_sqlite"] = {
            "SelectBatch_rows": pg["best_SelectBatch_rows"] / lite["best_SelectBatch_rows"],
            "Select_ids": pg["best_Select_ids"] / lite["best_Select_ids"],
            "Select_rows": pg["best_Select_rows"] / lite["best_Select_rows"],
        }
        for rpc in ("Select", "SelectBatch"):
            ratios = paired(results["runs"], rpc)
            summary["pg_over_sqlite"][f"{rpc}_paired_median"] = statistics.median(ratios)
            summary["pg_over_sqlite"][f"{rpc}_paired"] = ratios
    summary["loadavg_after"] = os.getloadavg()
    results["summary"] = summary
    print(json.dumps(summary, indent=2), flush=True)
    return results
