"""The statements the PostgreSQL store sends: prepared once per text and looked up by index even
as generic plans, pre-checks riding in the charges' round statement, and an item whose values
fail a shared statement failing alone."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from recsvc.ledger import BudgetExceeded
from recsvc.ledger.postgres import statements as sql_of
from recsvc.ledger.postgres import store as ledger_pg
from recsvc.ledger.testing import Stores, drawn_charge, resp, said
from recsvc.ledger.testing.postgres import (
    count_rounds,
    open_replica,
    queue_in_order,
    replicas,
    until,
)
from recsvc.ledger.units import charge_units


def _generic_plans(conn: psycopg.Connection, sql: str, types: list[str]) -> str:
    """The plan PostgreSQL caches for ``sql`` once it prefers a generic plan (never re-planned for
    the values at hand), with NULL parameters."""
    n = iter(range(1, 100))
    text = re.sub(r"%[sb]", lambda _m: f"${next(n)}", sql)
    conn.execute(f"PREPARE probe({', '.join(types)}) AS {text}")
    conn.execute("SET plan_cache_mode TO force_generic_plan")
    try:
        return "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE probe({', '.join(['NULL'] * len(types))})"))
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE probe")


# A stored request's columns (recsvc.ledger.charging.REQUEST_COLUMNS) as the statements bind them.
REQUEST_TYPES = ["text[]", "text[]", "bytea[]", "text[]", "bigint[]", "text[]", "text[]", "float8[]", "float8[]"]


def test_the_prepared_statements_look_users_up_by_index_even_as_generic_plans(pg_cluster, tmp_path: Path) -> None:
    """A prepared statement's generic plan is made without the arrays' values; on a pooled
    connection it must still find each user and request through the primary keys, never by
    scanning every user's row, however many users the ledger holds."""
    s, a, _ = replicas(pg_cluster, tmp_path)
    for i in range(300):
        a.charge(f"u{i}", "r", b"d", 0.001, resp("x"))
    with psycopg.connect(str(s.target), autocommit=True) as conn:
        conn.execute("ANALYZE")
    statements = {
        sql_of.PRECHECKS: ["text[]", "text[]"],
        sql_of.CHARGE_UNCHANGED: [
            "text[]",
            *["bigint[]"] * 6,
            "timestamptz",
            *REQUEST_TYPES,
        ],
        sql_of.WRITE: [
            "timestamptz",
            *REQUEST_TYPES,
            "text[]",
            "bigint[]",
            "bigint[]",
            "bigint[]",
        ],
    }
    with a._pool.connection() as conn:
        for sql, types in statements.items():
            plan = _generic_plans(conn, sql, types)
            assert "Index" in plan and "Seq Scan on recsvc_" not in plan, plan
    s.close_all()


@pytest.mark.parametrize("rolled_back", [False, True], ids=["one-statement", "statement-rolled-back"])
def test_pre_checks_ride_in_the_statement_of_the_charges_queued_with_them(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rolled_back: bool
) -> None:
    """A drawn charge of x and three pre-checks queue while the round before waits for the pool's
    only connection: the next round decides them in ONE statement. The pre-checks read its
    snapshot, as before its own write: x's second request sees x's account unmoved, draws, and is
    then decided under the lock with the first charge counted. If that statement fails with a
    unique violation (here a duplicate row it inserts), nothing of it is stored: the pre-checks
    read on their own and the charge goes to the locking transaction. Same outcomes either way."""

    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    a = open_replica(s, budget=1.0, pool_size=1)
    drawn_charge(a, "v", "stored", b"d", 0.5, lambda: 0, tag="stored")
    drawn_charge(a, "w", "r0", b"d", 0.9, lambda: 0, tag="w")
    if rolled_back:  # a data-modifying WITH runs even unreferenced: v's stored request, inserted again
        monkeypatch.setattr(  # where the store reads it
            ledger_pg,
            "CHARGE_AND_PRECHECK",
            sql_of.CHARGE_AND_PRECHECK.replace(
                "WITH ",
                "WITH boom AS (INSERT INTO recsvc_requests SELECT * FROM recsvc_requests WHERE user_id = 'v'), ",
                1,
            ),
        )
    rounds = count_rounds(a, monkeypatch)
    draws: list[str] = []
    out: dict[str, Any] = {}
    go = threading.Event()

    def charge(user: str, rid: str, eps: float, wait: bool = False) -> None:
        def draw() -> int:
            draws.append(rid)
            if wait:
                go.wait(10)
            return 0

        try:
            out[rid] = drawn_charge(a, user, rid, b"d", eps, draw, tag=rid)
        except Exception as exc:
            out[rid] = exc

    threads = [threading.Thread(target=charge, args=("x", "x1", 0.3, True))]
    threads[0].start()
    until(lambda: "x1" in draws)  # x1's pre-check is done, its draw waits
    held = a._pool.getconn()
    threads.append(threading.Thread(target=charge, args=("w", "r0", 0.9)))  # a replay: no charge follows
    threads[-1].start()
    until(lambda: a._pool.get_stats().get("requests_waiting", 0) >= 1)
    go.set()
    until(lambda: a._group_commit.queued() >= 1)  # x1's charge
    more = [
        threading.Thread(target=charge, args=args)
        for args in [("v", "stored", 0.5), ("w", "r1", 0.2), ("x", "x2", 0.4)]
    ]
    queue_in_order(a, more, queued=1)
    threads += more
    assert a._group_commit.queued() == 4
    a._pool.putconn(held)
    for t in threads:
        t.join(20)
    assert rounds == [(0, 1), (0, 1), (1, 3), (1, 0)]  # x1's pre-check, r0's, the shared round, x2's charge
    assert said(out["stored"], 2) == "stored|0.50" and out["stored"].replayed
    assert isinstance(out["r1"], BudgetExceeded)
    assert said(out["r0"], 2) == "w|0.10" and out["r0"].replayed
    assert (said(out["x1"], 2), said(out["x2"], 2)) == ("x1|0.70", "x2|0.30")
    assert sorted(draws) == ["x1", "x2"]  # the replays and the refusal drew nothing
    assert a.moved == (2 if rolled_back else 1)  # x2 (and x1, when the statement was rolled back)
    assert [(a.user(u).spent_units, a.user(u).requests) for u in "vwx"] == [
        (charge_units(0.5), 1),
        (charge_units(0.9), 1),
        (charge_units(0.7), 2),
    ]
    s.close_all()


def test_one_statement_text_is_one_prepared_statement_whatever_the_sizes_of_its_numbers(
    pg_cluster, tmp_path: Path
) -> None:
    """psycopg would send an int as int2, int4 or int8 by its size, and prepares a statement once
    per parameter types: the charges of a new user (no account read), of one who spends little and
    of one who spends much would be three statements. Every int is sent as int8 and "no account"
    as −1, so each statement text is prepared once, and on its first execution (psycopg's default
    is after 5, each parsed and planned until then)."""
    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    a = open_replica(s, budget=1.0, pool_size=1)
    drawn_charge(a, "first", "r", b"d", 1e-6, lambda: 0, tag="r")
    with a._pool.connection() as conn:
        texts = [t for (t,) in conn.execute("SELECT statement FROM pg_prepared_statements")]
    assert sum(t.endswith("SELECT user_id FROM charged") for t in texts) == 1, texts
    assert sum(t.startswith("SELECT q.fingerprint") for t in texts) == 1, texts
    for k in range(7):
        drawn_charge(a, "little", f"r{k}", b"d", 1e-6, lambda: 0, tag="r")
        drawn_charge(a, "much", f"r{k}", b"d", 0.1, lambda: 0, tag="r")
    assert a.user("little").spent_units < 2**15 * 1000 and a.user("much").spent_units > 2**31
    with a._pool.connection() as conn:
        texts = [t for (t,) in conn.execute("SELECT statement FROM pg_prepared_statements")]
    assert sum(t.endswith("SELECT user_id FROM charged") for t in texts) == 1, texts
    assert sum(t.startswith("SELECT q.fingerprint") for t in texts) == 1, texts
    s.close_all()


def test_an_item_whose_values_fail_the_shared_statement_fails_alone(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation refuses an id PostgreSQL's text cannot hold (a NUL). Should one reach the ledger,
    the statement of the round it shares with other users' charges and pre-checks fails as a whole,
    storing nothing; each item is then done again alone, so only that one fails: the others are
    charged or replayed, exactly once."""

    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    a = open_replica(s, budget=1.0, pool_size=1)
    drawn_charge(a, "v", "stored", b"d", 0.5, lambda: 0, tag="stored")
    rounds = count_rounds(a, monkeypatch)
    out: dict[str, Any] = {}

    def run(rid: str, call) -> None:
        try:
            out[rid] = call()
        except Exception as exc:
            out[rid] = exc

    held = a._pool.getconn()  # the first round waits for it while the others queue behind it
    threads = [
        threading.Thread(
            target=run, args=("first", lambda: drawn_charge(a, "f", "first", b"d", 0.1, lambda: 0, tag="first"))
        )
    ]
    threads[0].start()
    until(lambda: a._pool.get_stats().get("requests_waiting", 0) >= 1)
    queued = [
        ("charged", lambda: a.charge("c", "charged", b"d", 0.25, resp("charged"))),
        ("nul", lambda: drawn_charge(a, "bad\x00user", "nul", b"d", 0.2, lambda: 0, tag="nul")),
        ("stored", lambda: drawn_charge(a, "v", "stored", b"d", 0.5, lambda: 0, tag="stored")),
    ]
    threads += [threading.Thread(target=run, args=(rid, call)) for rid, call in queued]
    queue_in_order(a, threads[1:])
    assert a._group_commit.queued() == 3
    a._pool.putconn(held)
    for th in threads:
        th.join(20)
    # the charge (and perhaps first's, drawn meanwhile) and both pre-checks shared one statement,
    # which failed; then each item went alone
    assert rounds[0] == (0, 1) and rounds[1][0] >= 1 and rounds[1][1] == 2, rounds
    assert all(c + p == 1 for c, p in rounds[2:]), rounds
    assert isinstance(out["nul"], psycopg.DataError) and "0x00" in str(out["nul"])
    assert said(out["charged"], 2) == "charged|0.75" and not out["charged"].replayed
    assert said(out["stored"], 2) == "stored|0.50" and out["stored"].replayed
    assert said(out["first"], 2) == "first|0.90" and not out["first"].replayed
    assert [(a.user(u).spent_units, a.user(u).requests) for u in "cfv"] == [
        (charge_units(0.25), 1),
        (charge_units(0.1), 1),
        (charge_units(0.5), 1),
    ]
    s.close_all()
