"""The PostgreSQL store's optimistic charge (``PostgresLedger._charge_unchanged``): a drawn charge
is stored by ONE statement only if its user's account is still exactly what its pre-check read;
otherwise the locking transaction decides it. Each test moves the account between the pre-check
and the commit from "another replica" (a second store on the same database), inside ``draw``,
which runs between the two, and checks the outcome is the one the lock gives: exact spend, the
budget left that the answer reports, refusals, replays."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from recsvc.ledger import BatchItem, BudgetExceeded, Charge, Drawn
from recsvc.ledger.charging import Pending
from recsvc.ledger.group_commit import Queued
from recsvc.ledger.testing import Stores, drawn_charge, resp, said
from recsvc.ledger.testing.postgres import (
    lock_waiters,
    open_replica,
    queue_in_order,
    replicas,
    until,
)
from recsvc.ledger.units import charge_units
from recsvc.service.server import ledger_observer


def test_an_unchanged_account_is_charged_by_one_statement(pg_cluster, tmp_path: Path) -> None:
    s, a, _ = replicas(pg_cluster, tmp_path)
    first = drawn_charge(a, "u", "r1", b"d1", 0.25, lambda: 0, tag="r1")  # creates the account
    second = drawn_charge(a, "u", "r2", b"d2", 0.5, lambda: 0, tag="r2")  # moves it on
    assert (said(first, 2), said(second, 2)) == ("r1|0.75", "r2|0.25")
    assert (a.commits, a.moved) == (2, 0)
    assert (a.user("u").spent_units, a.user("u").requests) == (charge_units(0.75), 2)
    s.close_all()


@pytest.mark.parametrize("fresh", [False, True], ids=["existing-account", "first-charge"])
def test_an_account_moved_by_another_replica_is_decided_under_the_lock(pg_cluster, tmp_path: Path, fresh: bool) -> None:
    s, a, b = replicas(pg_cluster, tmp_path, observer=ledger_observer())  # the service's metrics
    if not fresh:
        a.charge("u", "r0", b"d0", 0.1, resp("r0"))

    def meanwhile() -> int:  # after a's pre-check read the account, before a's commit
        b.charge("u", "other", b"d", 0.3, resp("other"))
        return 0

    relocked = REGISTRY.get_sample_value("recsvc_ledger_relocked_total") or 0.0
    got = drawn_charge(a, "u", "r1", b"d1", 0.5, meanwhile, tag="r1")
    # 1 - 0.3 - 0.5 (- 0.1): the other replica's spend counts
    assert said(got, 2) == ("r1|0.20" if fresh else "r1|0.10") and not got.replayed
    assert a.moved == 1
    assert REGISTRY.get_sample_value("recsvc_ledger_relocked_total") == relocked + 1  # what operators see
    assert a.user("u").spent_units == charge_units(0.8 if fresh else 0.9)
    assert a.user("u").requests == (2 if fresh else 3)
    s.close_all()


def test_a_charge_that_no_longer_fits_is_refused_and_stores_nothing(pg_cluster, tmp_path: Path) -> None:
    s, a, b = replicas(pg_cluster, tmp_path)
    a.charge("u", "r0", b"d0", 0.1, resp("r0"))

    def meanwhile() -> int:
        b.charge("u", "other", b"d", 0.5, resp("other"))
        return 0

    with pytest.raises(BudgetExceeded, match=r"requested epsilon=0\.5 but only 0\.4 of 1 remains"):
        drawn_charge(a, "u", "r1", b"d1", 0.5, meanwhile, tag="r1")
    assert a.lookup("u", "r1") is None and a.moved == 1
    assert (a.user("u").spent_units, a.user("u").requests) == (charge_units(0.6), 2)
    s.close_all()


@pytest.mark.parametrize("other_commits", [True, False], ids=["other-commits", "other-rolls-back"])
def test_a_row_another_transaction_holds_is_skipped_by_the_round_and_waited_for_by_its_caller(
    pg_cluster, tmp_path: Path, other_commits: bool
) -> None:
    """Another replica's transaction holds the user's row (it moved the account, uncommitted)
    while the round runs: the optimistic statement waits for it at most ROUND_LOCK_S, the round's
    locking transaction skips it, and the charge's caller waits for it in its own transaction;
    whichever decides reads the row's NEWEST version: if the other transaction commits, its spend
    counts; if it rolls back, the charge is decided on the account as it was."""
    s, a, _ = replicas(pg_cluster, tmp_path)
    a.charge("u", "r0", b"d0", 0.1, resp("r0"))
    p = Pending("u", "r1", a.fingerprint(b"d1"), charge_units(0.5), drawn=Drawn(("r1",)))
    assert a._precheck(p) is None
    other = psycopg.connect(str(s.target))
    other.execute(
        "UPDATE recsvc_budgets SET spent_units = spent_units + %s, requests = requests + 1 WHERE user_id = 'u'",
        (charge_units(0.3),),
    )
    worker = threading.Thread(target=a._group_commit, args=([p],))
    worker.start()
    with psycopg.connect(str(s.target), autocommit=True) as watch:
        until(lambda: lock_waiters(watch) > 0)
    assert worker.is_alive() and not a.stalled()  # the caller waits for the row lock, no round does
    other.commit() if other_commits else other.rollback()
    other.close()
    worker.join(20)
    if other_commits:
        assert (said(p.result, 2), a.moved) == ("r1|0.10", 1)
        assert a.user("u").spent_units == charge_units(0.9)
    else:
        # The one statement charged it (the lock came within ROUND_LOCK_S) or the fallback did.
        assert said(p.result, 2) == "r1|0.40" and a.moved in (0, 1)
        assert a.user("u").spent_units == charge_units(0.6)
    s.close_all()


def test_the_same_request_stored_by_another_replica_meanwhile_is_replayed(pg_cluster, tmp_path: Path) -> None:
    s, a, b = replicas(pg_cluster, tmp_path)
    a.charge("u", "r0", b"d0", 0.1, resp("r0"))

    def meanwhile() -> int:  # a retry of r1 that reached the other replica and was answered there
        drawn_charge(b, "u", "r1", b"d1", 0.5, lambda: 0, tag="from-b")
        return 0

    got = drawn_charge(a, "u", "r1", b"d1", 0.5, meanwhile, tag="from-a")
    assert said(got, 2) == "from-b|0.40" and got.replayed  # the answer the client may already hold
    assert (a.user("u").spent_units, a.user("u").requests) == (charge_units(0.6), 2)  # charged once
    s.close_all()


def test_one_group_charges_unchanged_users_at_once_and_locks_for_the_moved_one(pg_cluster, tmp_path: Path) -> None:
    """A group-commit leader's queue with three users, one of whose accounts moved since its
    pre-check: the other two are stored by the one statement, the third by the locking
    transaction, each with the budget left it really has."""
    s, a, b = replicas(pg_cluster, tmp_path)
    for u in ("x", "y"):
        a.charge(u, "r0", b"d0", 0.1, resp("r0"))
    queue = [Pending(u, "r1", a.fingerprint(b"d1"), charge_units(0.5), drawn=Drawn((u,))) for u in ("x", "y", "z")]
    for p in queue:
        assert a._precheck(p) is None and p.seen is not None
    b.charge("y", "other", b"d", 0.2, resp("other"))
    commits = a.commits
    taken: list[Queued] = list(queue)  # _commit_group takes list[Queued]; list is invariant
    a._commit_group(lambda: taken)
    assert [said(p.result, 2) for p in queue] == ["x|0.40", "y|0.20", "z|0.50"]
    assert (a.commits - commits, a.moved) == (2, 1)  # one optimistic statement, one locking transaction
    assert [a.user(u).spent_units for u in ("x", "y", "z")] == [charge_units(e) for e in (0.6, 0.8, 0.5)]
    s.close_all()


def test_a_batch_whose_user_moved_meanwhile_is_decided_under_the_lock_for_that_user(pg_cluster, tmp_path: Path) -> None:
    """SelectBatch: the snapshot's accounts are what the one statement checks, per user."""
    s, a, b = replicas(pg_cluster, tmp_path)
    a.charge("y", "r0", b"d0", 0.1, resp("r0"))
    items = [
        BatchItem(u, q, b"d" + q.encode(), 0.3, "rnm") for u, q in (("x", "1"), ("y", "1"), ("x", "2"), ("y", "2"))
    ]

    with a.reserve_batch(items) as r:
        b.charge("y", "other", b"d", 0.3, resp("other"))  # another replica, after the snapshot
        got = a.commit_batch(r, [Drawn((str(i),)) for i in r.todo])
    assert [said(c, 1) if isinstance(c, Charge) else type(c) for c in got] == ["0|0.7", "1|0.3", "2|0.4", "3|0.0"]
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
    a = open_replica(s, budget=1.0, pool_size=1)
    drawn_charge(a, "v", "stored", b"d", 0.5, lambda: 0, tag="stored")
    drawn_charge(a, "w", "r0", b"d", 0.9, lambda: 0, tag="w")
    draws: list[str] = []
    out: dict[str, Any] = {}

    def charge(user: str, rid: str, eps: float) -> None:
        def draw() -> int:
            draws.append(rid)
            return 0

        try:
            out[rid] = drawn_charge(a, user, rid, b"d", eps, draw, tag=rid)
        except Exception as exc:
            out[rid] = exc

    held = a._pool.getconn()  # the leader's read waits for it
    threads = [threading.Thread(target=charge, args=("u", "lead", 0.1))]
    threads[0].start()
    until(lambda: a._pool.get_stats().get("requests_waiting", 0) >= 1)
    for user, rid, eps in [("v", "stored", 0.5), ("w", "r1", 0.2), ("x", "fresh", 0.3)]:
        threads.append(threading.Thread(target=charge, args=(user, rid, eps)))
        threads[-1].start()
    until(lambda: a._group_commit.queued() >= 3)
    assert a._group_commit.queued() == 3
    a._pool.putconn(held)
    for t in threads:
        t.join(20)
    assert said(out["stored"], 2) == "stored|0.50" and out["stored"].replayed
    assert isinstance(out["r1"], BudgetExceeded)
    assert (said(out["lead"], 2), said(out["fresh"], 2)) == ("lead|0.90", "fresh|0.70")
    assert sorted(draws) == ["fresh", "lead"]  # the replay and the refusal drew nothing
    s.close_all()


def test_a_failed_pre_check_read_refuses_every_queued_charge_and_draws_nothing(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared rounds that fail (here with a server-side error): the first leader's, then the one
    its successor makes for the two pre-checks that queued meanwhile. Every charge fails with the
    error, the one that waited for another's read included; none draws, nothing is spent."""

    s, a, _ = replicas(pg_cluster, tmp_path)
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
            out[user] = drawn_charge(a, user, "r1", b"d1", 0.5, draw, tag=user)
        except Exception as exc:
            out[user] = exc

    users = ("leader", "successor", "waiter")
    threads = [threading.Thread(target=charge, args=(u,)) for u in users]
    threads[0].start()
    until(lambda: a._group_commit._leading)
    queue_in_order(a, threads[1:])  # the first to queue leads next
    assert a._group_commit.queued() == 2
    release.set()
    for th in threads:
        th.join(20)
    assert all(isinstance(out[u], psycopg.errors.InternalError) for u in users), out
    assert draws == []
    monkeypatch.undo()
    assert [a.user(u).spent_units for u in users] == [0, 0, 0]
    s.close_all()
