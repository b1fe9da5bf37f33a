"""The PostgreSQL store's optimistic charge (``PostgresLedger._charge_unchanged``): a drawn charge
is stored by ONE statement only if its user's account is still exactly what its pre-check read;
otherwise the locking transaction decides it. Each test moves the account between the pre-check
and the commit from "another replica" (a second store on the same database), inside ``draw``,
which runs between the two, and checks the outcome is the one the lock gives: exact spend, the
budget left that the answer reports, refusals, replays."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from prometheus_client import REGISTRY

from recsvc.ledger import BatchItem, BudgetExceeded, Charge, LedgerObserver
from recsvc.ledger.charging import Pending
from recsvc.ledger.group_commit import Queued
from recsvc.ledger.postgres import PostgresLedger
from recsvc.ledger.postgres import store as ledger_pg
from recsvc.ledger.testing import Stores
from recsvc.ledger.testing.cluster import Cluster
from recsvc.ledger.units import charge_units
from recsvc.service.server import ledger_observer


def _replicas(
    pg_cluster: Cluster, tmp_path: Path, budget: float = 1.0, observer: LedgerObserver | None = None
) -> tuple[Stores, PostgresLedger, PostgresLedger]:
    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    return s, _open(s, budget=budget, observer=observer), _open(s, budget=budget)


def _open(s: Stores, **settings: Any) -> PostgresLedger:
    """A replica of the PostgreSQL ledger ``s`` names."""
    return cast(PostgresLedger, s.open(**settings))


def _until(done: Callable[[], bool], seconds: float = 10.0) -> None:
    """Waits for other threads to reach a point (``done()``), at most ``seconds``; the caller's
    asserts then say what did not happen."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.002)


def _queued(a: PostgresLedger, n: int) -> Callable[[], bool]:
    """Whether ``n`` items have queued for ``a``'s next round."""
    return lambda: a._group_commit.queued() >= n


def _lock_waiters(conn: psycopg.Connection[Any]) -> int:
    """How many server backends wait for a lock."""
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
    assert row is not None
    return row[0]


def _queue_in_order(a: PostgresLedger, threads: list[threading.Thread], queued: int = 0) -> None:
    """Starts ``threads`` one by one, each once the one before has queued for ``a``'s next round
    (which holds ``queued`` items before them), so they queue, and lead, in that order."""
    for n, thread in enumerate(threads, start=queued + 1):
        thread.start()
        _until(_queued(a, n))


def _rounds(a, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (charges, pre-checks) of each round statement ``a`` runs from now on."""
    rounds: list[tuple[int, int]] = []
    unchanged = a._charge_unchanged

    def counted(conn: psycopg.Connection, charges: list, probes: list) -> tuple:
        rounds.append((len(charges), len(probes)))
        return unchanged(conn, charges, probes)

    monkeypatch.setattr(a, "_charge_unchanged", counted)
    return rounds


def _answer(tag: str):
    return lambda _sample, remaining: f"{tag}|{remaining:.2f}".encode()


def _built(tag: str) -> Callable[[float], bytes]:
    """A pending charge's response builder: ``tag`` and the budget left."""
    return lambda remaining: f"{tag}|{remaining:.2f}".encode()


def test_an_unchanged_account_is_charged_by_one_statement(pg_cluster, tmp_path: Path) -> None:
    s, a, _ = _replicas(pg_cluster, tmp_path)
    first = a.draw_and_charge("u", "r1", b"d1", 0.25, lambda: 0, _answer("r1"))  # creates the account
    second = a.draw_and_charge("u", "r2", b"d2", 0.5, lambda: 0, _answer("r2"))  # moves it on
    assert (first.response, second.response) == (b"r1|0.75", b"r2|0.25")
    assert (a.commits, a.moved) == (2, 0)
    assert (a.user("u").spent_units, a.user("u").requests) == (charge_units(0.75), 2)
    s.close_all()


@pytest.mark.parametrize("fresh", [False, True], ids=["existing-account", "first-charge"])
def test_an_account_moved_by_another_replica_is_decided_under_the_lock(pg_cluster, tmp_path: Path, fresh: bool) -> None:
    s, a, b = _replicas(pg_cluster, tmp_path, observer=ledger_observer())  # the service's metrics
    if not fresh:
        a.charge("u", "r0", b"d0", 0.1, lambda rem: b"r0")

    def meanwhile() -> int:  # after a's pre-check read the account, before a's commit
        b.charge("u", "other", b"d", 0.3, lambda rem: b"other")
        return 0

    relocked = REGISTRY.get_sample_value("recsvc_ledger_relocked_total") or 0.0
    got = a.draw_and_charge("u", "r1", b"d1", 0.5, meanwhile, _answer("r1"))
    # 1 - 0.3 - 0.5 (- 0.1): the other replica's spend counts
    assert got.response == (b"r1|0.20" if fresh else b"r1|0.10") and not got.replayed
    assert a.moved == 1
    assert REGISTRY.get_sample_value("recsvc_ledger_relocked_total") == relocked + 1  # what operators see
    assert a.user("u").spent_units == charge_units(0.8 if fresh else 0.9)
    assert a.user("u").requests == (2 if fresh else 3)
    s.close_all()


def test_a_charge_that_no_longer_fits_is_refused_and_stores_nothing(pg_cluster, tmp_path: Path) -> None:
    s, a, b = _replicas(pg_cluster, tmp_path)
    a.charge("u", "r0", b"d0", 0.1, lambda rem: b"r0")

    def meanwhile() -> int:
        b.charge("u", "other", b"d", 0.5, lambda rem: b"other")
        return 0

    with pytest.raises(BudgetExceeded, match=r"requested epsilon=0\.5 but only 0\.4 of 1 remains"):
        a.draw_and_charge("u", "r1", b"d1", 0.5, meanwhile, _answer("r1"))
    assert a.lookup("u", "r1") is None and a.moved == 1
    assert (a.user("u").spent_units, a.user("u").requests) == (charge_units(0.6), 2)
    s.close_all()


@pytest.mark.parametrize("other_commits", [True, False], ids=["other-commits", "other-rolls-back"])
def test_the_statement_that_waits_for_a_row_lock_rechecks_the_account(
    pg_cluster, tmp_path: Path, other_commits: bool
) -> None:
    """Another replica's transaction holds the user's row (it moved the account, uncommitted)
    while the optimistic statement runs: the statement waits for the lock, then checks the row's
    NEWEST version. If the other transaction commits, the account moved and the locking
    transaction decides (the other's spend counts); if it rolls back, the one statement charges."""
    s, a, _ = _replicas(pg_cluster, tmp_path)
    a.charge("u", "r0", b"d0", 0.1, lambda rem: b"r0")
    p = Pending("u", "r1", a.fingerprint(b"d1"), charge_units(0.5), lambda rem: f"r1|{rem:.2f}".encode())
    assert a._precheck(p) is None
    other = psycopg.connect(str(s.target))
    other.execute(
        "UPDATE recsvc_budgets SET spent_units = spent_units + %s, requests = requests + 1 WHERE user_id = 'u'",
        (charge_units(0.3),),
    )
    worker = threading.Thread(target=a._commit_group, args=(lambda: [p],))
    worker.start()
    with psycopg.connect(str(s.target), autocommit=True) as watch:
        _until(lambda: _lock_waiters(watch) > 0)
    assert worker.is_alive()  # waiting for the row lock
    other.commit() if other_commits else other.rollback()
    other.close()
    worker.join(20)
    if other_commits:
        assert (p.result.response, a.moved) == (b"r1|0.10", 1)
        assert a.user("u").spent_units == charge_units(0.9)
    else:
        assert (p.result.response, a.moved) == (b"r1|0.40", 0)
        assert a.user("u").spent_units == charge_units(0.6)
    s.close_all()


def test_the_same_request_stored_by_another_replica_meanwhile_is_replayed(pg_cluster, tmp_path: Path) -> None:
    s, a, b = _replicas(pg_cluster, tmp_path)
    a.charge("u", "r0", b"d0", 0.1, lambda rem: b"r0")

    def meanwhile() -> int:  # a retry of r1 that reached the other replica and was answered there
        b.draw_and_charge("u", "r1", b"d1", 0.5, lambda: 0, _answer("from-b"))
        return 0

    got = a.draw_and_charge("u", "r1", b"d1", 0.5, meanwhile, _answer("from-a"))
    assert got.response == b"from-b|0.40" and got.replayed  # the answer the client may already hold
    assert (a.user("u").spent_units, a.user("u").requests) == (charge_units(0.6), 2)  # charged once
    s.close_all()


def test_one_group_charges_unchanged_users_at_once_and_locks_for_the_moved_one(pg_cluster, tmp_path: Path) -> None:
    """A group-commit leader's queue with three users, one of whose accounts moved since its
    pre-check: the other two are stored by the one statement, the third by the locking
    transaction, each with the budget left it really has."""
    s, a, b = _replicas(pg_cluster, tmp_path)
    for u in ("x", "y"):
        a.charge(u, "r0", b"d0", 0.1, lambda rem: b"r0")
    queue = [Pending(u, "r1", a.fingerprint(b"d1"), charge_units(0.5), _built(u)) for u in ("x", "y", "z")]
    for p in queue:
        assert a._precheck(p) is None and p.seen is not False
    b.charge("y", "other", b"d", 0.2, lambda rem: b"other")
    commits = a.commits
    taken: list[Queued] = list(queue)  # _commit_group takes list[Queued]; list is invariant
    a._commit_group(lambda: taken)
    assert [p.result.response for p in queue] == [b"x|0.40", b"y|0.20", b"z|0.50"]
    assert (a.commits - commits, a.moved) == (2, 1)  # one optimistic statement, one locking transaction
    assert [a.user(u).spent_units for u in ("x", "y", "z")] == [charge_units(e) for e in (0.6, 0.8, 0.5)]
    s.close_all()


def test_a_batch_whose_user_moved_meanwhile_is_decided_under_the_lock_for_that_user(pg_cluster, tmp_path: Path) -> None:
    """SelectBatch: the snapshot's accounts are what the one statement checks, per user."""
    s, a, b = _replicas(pg_cluster, tmp_path)
    a.charge("y", "r0", b"d0", 0.1, lambda rem: b"r0")
    items = [
        BatchItem(u, q, b"d" + q.encode(), 0.3, "rnm") for u, q in (("x", "1"), ("y", "1"), ("x", "2"), ("y", "2"))
    ]

    def draw(todo: list[int]) -> list[int]:
        b.charge("y", "other", b"d", 0.3, lambda rem: b"other")  # another replica, after the snapshot
        return todo

    got = a.draw_and_charge_batch(items, draw, lambda i, _s, rem: f"{i}|{rem:.1f}".encode())
    assert [c.response if isinstance(c, Charge) else type(c) for c in got] == [b"0|0.7", b"1|0.3", b"2|0.4", b"3|0.0"]
    assert a.moved == 2  # y's two items
    assert [(a.user(u).spent_units, a.user(u).requests) for u in "xy"] == [
        (charge_units(0.6), 2),
        (charge_units(1.0), 4),
    ]
    s.close_all()


def test_pre_checks_that_queue_share_one_read_and_each_gets_its_own_verdict(pg_cluster, tmp_path: Path) -> None:
    """While the pre-check leader waits for the pool's only connection, three more pre-checks
    queue; they are then answered by one read: a replay, a refusal and a fresh charge."""

    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    a = _open(s, budget=1.0, pool_size=1)
    a.draw_and_charge("v", "stored", b"d", 0.5, lambda: 0, _answer("stored"))
    a.draw_and_charge("w", "r0", b"d", 0.9, lambda: 0, _answer("w"))
    draws: list[str] = []
    out: dict[str, Any] = {}

    def charge(user: str, rid: str, eps: float) -> None:
        def draw() -> int:
            draws.append(rid)
            return 0

        try:
            out[rid] = a.draw_and_charge(user, rid, b"d", eps, draw, _answer(rid))
        except Exception as exc:
            out[rid] = exc

    held = a._pool.getconn()  # the leader's read waits for it
    threads = [threading.Thread(target=charge, args=("u", "lead", 0.1))]
    threads[0].start()
    _until(lambda: a._pool.get_stats().get("requests_waiting", 0) >= 1)
    for user, rid, eps in [("v", "stored", 0.5), ("w", "r1", 0.2), ("x", "fresh", 0.3)]:
        threads.append(threading.Thread(target=charge, args=(user, rid, eps)))
        threads[-1].start()
    _until(lambda: a._group_commit.queued() >= 3)
    assert a._group_commit.queued() == 3
    a._pool.putconn(held)
    for t in threads:
        t.join(20)
    assert out["stored"].response == b"stored|0.50" and out["stored"].replayed
    assert isinstance(out["r1"], BudgetExceeded)
    assert (out["lead"].response, out["fresh"].response) == (b"lead|0.90", b"fresh|0.70")
    assert sorted(draws) == ["fresh", "lead"]  # the replay and the refusal drew nothing
    s.close_all()


def test_a_failed_pre_check_read_refuses_every_queued_charge_and_draws_nothing(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared rounds that fail (here with a server-side error): the first leader's, then the one
    its successor makes for the two pre-checks that queued meanwhile. Every charge fails with the
    error, the one that waited for another's read included; none draws, nothing is spent."""

    s, a, _ = _replicas(pg_cluster, tmp_path)
    release = threading.Event()

    def broken(conn: object, charges: list, probes: list) -> tuple:
        release.wait(10)
        raise psycopg.errors.InternalError("could not read block 7 in file base/16384/16390")

    monkeypatch.setattr(a, "_charge_unchanged", broken)
    draws: list[str] = []
    out: dict[str, Any] = {}

    def charge(user: str) -> None:
        def draw() -> int:
            draws.append(user)
            return 0

        try:
            out[user] = a.draw_and_charge(user, "r1", b"d1", 0.5, draw, _answer(user))
        except Exception as exc:
            out[user] = exc

    users = ("leader", "successor", "waiter")
    threads = [threading.Thread(target=charge, args=(u,)) for u in users]
    threads[0].start()
    _until(lambda: a._group_commit._leading)
    _queue_in_order(a, threads[1:])  # the first to queue leads next
    assert a._group_commit.queued() == 2
    release.set()
    for th in threads:
        th.join(20)
    assert all(isinstance(out[u], psycopg.errors.InternalError) for u in users), out
    assert draws == []
    monkeypatch.undo()
    assert [a.user(u).spent_units for u in users] == [0, 0, 0]
    s.close_all()


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


def test_the_prepared_statements_look_users_up_by_index_even_as_generic_plans(pg_cluster, tmp_path: Path) -> None:
    """A prepared statement's generic plan is made without the arrays' values; on a pooled
    connection it must still find each user and request through the primary keys, never by
    scanning every user's row, however many users the ledger holds."""
    s, a, _ = _replicas(pg_cluster, tmp_path)
    for i in range(300):
        a.charge(f"u{i}", "r", b"d", 0.001, lambda rem: b"x")
    with psycopg.connect(str(s.target), autocommit=True) as conn:
        conn.execute("ANALYZE")
    statements = {
        ledger_pg.PRECHECKS: ["text[]", "text[]"],
        ledger_pg.CHARGE_UNCHANGED: [
            "text[]",
            *["bigint[]"] * 6,
            "timestamptz",
            "text[]",
            "text[]",
            "bytea[]",
            "bigint[]",
            "bytea[]",
            "text[]",
        ],
        ledger_pg.WRITE: [
            "timestamptz",
            "text[]",
            "text[]",
            "bytea[]",
            "bigint[]",
            "bytea[]",
            "text[]",
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
    a = _open(s, budget=1.0, pool_size=1)
    a.draw_and_charge("v", "stored", b"d", 0.5, lambda: 0, _answer("stored"))
    a.draw_and_charge("w", "r0", b"d", 0.9, lambda: 0, _answer("w"))
    if rolled_back:  # a data-modifying WITH runs even unreferenced: v's stored request, inserted again
        monkeypatch.setattr(
            ledger_pg,
            "CHARGE_AND_PRECHECK",
            ledger_pg.CHARGE_AND_PRECHECK.replace(
                "WITH ",
                "WITH boom AS (INSERT INTO recsvc_requests SELECT * FROM recsvc_requests WHERE user_id = 'v'), ",
                1,
            ),
        )
    rounds = _rounds(a, monkeypatch)
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
            out[rid] = a.draw_and_charge(user, rid, b"d", eps, draw, _answer(rid))
        except Exception as exc:
            out[rid] = exc

    threads = [threading.Thread(target=charge, args=("x", "x1", 0.3, True))]
    threads[0].start()
    _until(lambda: "x1" in draws)  # x1's pre-check is done, its draw waits
    held = a._pool.getconn()
    threads.append(threading.Thread(target=charge, args=("w", "r0", 0.9)))  # a replay: no charge follows
    threads[-1].start()
    _until(lambda: a._pool.get_stats().get("requests_waiting", 0) >= 1)
    go.set()
    _until(lambda: a._group_commit.queued() >= 1)  # x1's charge
    more = [
        threading.Thread(target=charge, args=args)
        for args in [("v", "stored", 0.5), ("w", "r1", 0.2), ("x", "x2", 0.4)]
    ]
    _queue_in_order(a, more, queued=1)
    threads += more
    assert a._group_commit.queued() == 4
    a._pool.putconn(held)
    for t in threads:
        t.join(20)
    assert rounds == [(0, 1), (0, 1), (1, 3), (1, 0)]  # x1's pre-check, r0's, the shared round, x2's charge
    assert out["stored"].response == b"stored|0.50" and out["stored"].replayed
    assert isinstance(out["r1"], BudgetExceeded)
    assert out["r0"].response == b"w|0.10" and out["r0"].replayed
    assert (out["x1"].response, out["x2"].response) == (b"x1|0.70", b"x2|0.30")
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
    a = _open(s, budget=1.0, pool_size=1)
    a.draw_and_charge("first", "r", b"d", 1e-6, lambda: 0, _answer("r"))
    with a._pool.connection() as conn:
        texts = [t for (t,) in conn.execute("SELECT statement FROM pg_prepared_statements")]
    assert sum(t.endswith("SELECT user_id FROM charged") for t in texts) == 1, texts
    assert sum(t.startswith("SELECT q.fingerprint") for t in texts) == 1, texts
    for k in range(7):
        a.draw_and_charge("little", f"r{k}", b"d", 1e-6, lambda: 0, _answer("r"))
        a.draw_and_charge("much", f"r{k}", b"d", 0.1, lambda: 0, _answer("r"))
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
    a = _open(s, budget=1.0, pool_size=1)
    a.draw_and_charge("v", "stored", b"d", 0.5, lambda: 0, _answer("stored"))
    rounds = _rounds(a, monkeypatch)
    out: dict[str, Any] = {}

    def run(rid: str, call) -> None:
        try:
            out[rid] = call()
        except Exception as exc:
            out[rid] = exc

    held = a._pool.getconn()  # the first round waits for it while the others queue behind it
    threads = [
        threading.Thread(
            target=run, args=("first", lambda: a.draw_and_charge("f", "first", b"d", 0.1, lambda: 0, _answer("first")))
        )
    ]
    threads[0].start()
    _until(lambda: a._pool.get_stats().get("requests_waiting", 0) >= 1)
    queued = [
        ("charged", lambda: a.charge("c", "charged", b"d", 0.25, lambda rem: f"charged|{rem:.2f}".encode())),
        ("nul", lambda: a.draw_and_charge("bad\x00user", "nul", b"d", 0.2, lambda: 0, _answer("nul"))),
        ("stored", lambda: a.draw_and_charge("v", "stored", b"d", 0.5, lambda: 0, _answer("stored"))),
    ]
    threads += [threading.Thread(target=run, args=(rid, call)) for rid, call in queued]
    _queue_in_order(a, threads[1:])
    assert a._group_commit.queued() == 3
    a._pool.putconn(held)
    for th in threads:
        th.join(20)
    # the charge (and perhaps first's, drawn meanwhile) and both pre-checks shared one statement,
    # which failed; then each item went alone
    assert rounds[0] == (0, 1) and rounds[1][0] >= 1 and rounds[1][1] == 2, rounds
    assert all(c + p == 1 for c, p in rounds[2:]), rounds
    assert isinstance(out["nul"], psycopg.DataError) and "0x00" in str(out["nul"])
    assert out["charged"].response == b"charged|0.75" and not out["charged"].replayed
    assert out["stored"].response == b"stored|0.50" and out["stored"].replayed
    assert out["first"].response == b"first|0.90" and not out["first"].replayed
    assert [(a.user(u).spent_units, a.user(u).requests) for u in "cfv"] == [
        (charge_units(0.25), 1),
        (charge_units(0.1), 1),
        (charge_units(0.5), 1),
    ]
    s.close_all()
