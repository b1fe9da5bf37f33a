"""recsvc's client-side CPU for one round statement of the PostgreSQL ledger, in psycopg.

A single Select with the PostgreSQL ledger rides in about half a round statement: the charges and
pre-checks queued in a process while its previous round ran (``recsvc.ledger.postgres.statements.CHARGE_AND_PRECHECK``).
This measures the CPU that statement costs the recsvc process (``time.thread_time``: psycopg,
libpq and the socket calls), for a round of 3 charges of new users and 3 pre-checks, in three
ways, interleaved in blocks so that a busy machine slows them alike:

* ``lists, new cursor``: the columns as Python lists, adapted element by element by psycopg, on
  a new cursor each time (``conn.execute``);
* ``binary arrays, new cursor``: the columns packed once in PostgreSQL's binary array format
  (``recsvc.ledger.postgres.arrays``);
* ``binary arrays, kept cursor``: as the ledger runs them now (``Connection.run``);

and a floor: ``SELECT 1`` through libpq alone (``pgconn.exec_``), one round trip with nothing to
adapt. Each is reported in µs per statement and over the floor.

    .venv/bin/python -m scripts.bench.pg_client [--rounds 40] [--block 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

from recsvc.ledger.postgres import PostgresLedger, connection
from recsvc.ledger.postgres.statements import ACCOUNT, CHARGE_AND_PRECHECK, KEY, REQUEST, SEEN, columns
from scripts.bench.harness import throwaway_cluster

WARM = 4  # rounds not counted: connections, prepared statements and caches warm up


def round_rows(i: int) -> tuple[list[tuple], list[tuple], list[tuple], list[tuple]]:
    """Round ``i``'s accounts, accounts as read (none: new users), requests and pre-check keys."""
    users = sorted(f"user-{i}-{k}" for k in range(3))
    accounts = [(u, 5_000_000, 0, 1) for u in users]  # recsvc.ledger.charging.AccountWrite
    seen = [(-1, -1, -1)] * 3
    slate = '["' + os.urandom(8).hex() + '"]'  # recsvc.ledger.charging.RequestWrite.row()
    requests = [(u, f"req-{i}", os.urandom(32), "rnm", 5_000_000, slate, "[]", 5e-6, 0.5) for u in users]
    keys = [(f"probe-{i}-{k}", f"req-{i}") for k in range(3)]
    return accounts, seen, requests, keys


def as_lists(rows: tuple, now: datetime) -> tuple:
    accounts, seen, requests, keys = rows
    cols = [list(c) for part in (accounts, seen) for c in zip(*part, strict=False)]
    return (*cols, now, *[list(c) for c in zip(*requests, strict=False)], *[list(c) for c in zip(*keys, strict=False)])


def as_arrays(rows: tuple, now: datetime) -> tuple:
    accounts, seen, requests, keys = rows
    return (*columns(accounts, ACCOUNT), *columns(seen, SEEN), now, *columns(requests, REQUEST), *columns(keys, KEY))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help=f"blocks per way (the first {WARM} not counted)")
    ap.add_argument("--block", type=int, default=50, help="statements per block")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.rounds <= WARM or args.block < 1:
        ap.error(f"--rounds must be > {WARM} and --block >= 1")
    stack = ExitStack()  # removes the cluster
    cluster = throwaway_cluster(stack)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = cluster.new_database()
            PostgresLedger(url, 1e6, Path(tmp) / "key", create=True).close()  # the schema
            conn = connection.Connection.connect(url, autocommit=True, prepare_threshold=0)
            connection.configure(conn)
            ids = count()
            now = datetime.now(UTC)

            def statement(pack: Callable[[tuple, datetime], tuple], kept: bool) -> Callable[[], Any]:
                def run() -> Any:
                    params = pack(round_rows(next(ids)), now)
                    return (conn.run if kept else conn.execute)(CHARGE_AND_PRECHECK, params).fetchall()

                return run

            def rows_only(pack: Callable[[tuple, datetime], tuple]) -> Callable[[], Any]:
                return lambda: pack(round_rows(next(ids)), now)

            ways = {
                "lists, new cursor": statement(as_lists, kept=False),
                "binary arrays, new cursor": statement(as_arrays, kept=False),
                "binary arrays, kept cursor": statement(as_arrays, kept=True),
                "SELECT 1 through libpq (floor)": lambda: conn.pgconn.exec_(b"SELECT 1"),
            }
            # building the rows (ids, random bytes) is the benchmark's, not psycopg's: measured apart
            building = {
                "lists, new cursor": rows_only(as_lists),
                "binary arrays, new cursor": rows_only(as_arrays),
                "binary arrays, kept cursor": rows_only(as_arrays),
            }
            cpu = dict.fromkeys([*ways, *(f"build:{k}" for k in building)], 0.0)
            for r in range(args.rounds):
                for name, fn in [*ways.items(), *((f"build:{k}", f) for k, f in building.items())]:
                    t0 = time.thread_time()
                    for _ in range(args.block):
                        fn()
                    if r >= WARM:
                        cpu[name] += time.thread_time() - t0
            conn.close()
    finally:
        stack.close()
    n = (args.rounds - WARM) * args.block
    us = {k: cpu[k] / n * 1e6 - (cpu.get(f"build:{k}", 0.0) / n * 1e6) for k in ways}
    floor = us["SELECT 1 through libpq (floor)"]
    print(f"client CPU per round statement (3 charges + 3 pre-checks), {n} statements per way:")
    for k, v in us.items():
        print(f"  {k:32s} {v:6.1f} µs   {v / floor:4.2f}× the floor")
    if args.json:
        args.json.write_text(
            json.dumps({"us_per_statement": us, "statements": n, "loadavg": os.getloadavg()}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
