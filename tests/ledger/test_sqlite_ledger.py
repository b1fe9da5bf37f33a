"""The SQLite ledger: atomic check-and-spend, replay, conflicts, durability, group commit, processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from recsvc.ledger import BudgetExceeded, Charge, RequestConflict
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.ledger.testing import drawn_charge, resp, said

_resp = resp


def test_spend_replay_conflict_and_exhaustion(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)
    c = led.charge("alice", "r1", b"fp1", 0.4, _resp("a"))
    assert (c.replayed, said(c, 6)) == (False, "a|0.600000")
    # Same request again: the stored bytes, nothing spent.
    again = led.charge("alice", "r1", b"fp1", 0.4, _resp("DIFFERENT"))
    assert (again.replayed, said(again, 6)) == (True, "a|0.600000")
    assert led.user("alice").spent_units == 400_000_000_000  # exact: units of 1e-12
    # Same request_id, other parameters: refused, nothing spent.
    with pytest.raises(RequestConflict, match="different parameters"):
        led.charge("alice", "r1", b"fp2", 0.4, _resp("b"))
    # request_ids are scoped per user.
    assert led.charge("bob", "r1", b"fp2", 0.4, _resp("b")).replayed is False
    led.charge("alice", "r2", b"x", 0.6, _resp("c"))
    with pytest.raises(BudgetExceeded, match="only 0 of 1 remains"):
        led.charge("alice", "r3", b"y", 0.01, _resp("d"))
    u = led.user("alice")
    assert (u.spent_units, u.requests, u.remaining) == (10**12, 2, 0.0)
    assert led.lookup("alice", "r3") is None  # the refused request left no trace
    assert led.totals() == {"alice": pytest.approx(1.0), "bob": pytest.approx(0.4)}


def test_exact_units_fit_the_last_charge_with_no_slack(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)
    for i in range(50):  # 50 × 0.02 is 1.0000000000000002 in floats, exactly 1 in units
        led.charge("u", f"r{i}", b"f", 0.02, _resp("x"))
    with pytest.raises(BudgetExceeded, match=r"requested epsilon=0\.02 but only 0 of 1 remains"):
        led.charge("u", "r50", b"f", 0.02, _resp("x"))
    with pytest.raises(BudgetExceeded):  # not even one unit more: the comparison has no slack
        led.charge("u", "r51", b"f", 1e-12, _resp("x"))
    assert (led.user("u").requests, led.user("u").spent_units) == (50, 10**12)


def test_survives_reopen_and_uses_durable_wal(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    led = SQLiteLedger(path, budget=2.0)
    led.charge("u", "r", b"f", 1.5, _resp("x"))
    mode = led._conn().execute("PRAGMA journal_mode").fetchone()[0]
    sync = led._conn().execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, sync) == ("wal", 2)  # 2 = FULL: the WAL is fsynced at every commit
    led.close()
    led2 = SQLiteLedger(path, budget=2.0)
    assert led2.user("u").spent == 1.5
    assert said(led2.charge("u", "r", b"f", 1.5, _resp("y"))) == "x|0.500000"
    with pytest.raises(BudgetExceeded):
        led2.charge("u", "r2", b"f", 0.6, _resp("y"))


def test_bad_budget_and_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="budget must be a finite number > 0"):
        SQLiteLedger(tmp_path / "l.db", budget=0.0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SQLiteLedger(tmp_path / "nope" / "l.db", budget=1.0)


def _spend_many(path: str, worker: int, attempts: int, out: mp.Queue) -> None:
    led = SQLiteLedger(path, budget=5.0)
    ok = 0
    for i in range(attempts):
        try:
            led.charge("shared", f"w{worker}-{i}", b"f", 0.1, _resp("x"))
            ok += 1
        except BudgetExceeded:
            pass
    out.put(ok)


def test_check_and_spend_is_atomic_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "l.db")
    SQLiteLedger(path, budget=5.0).close()
    q: mp.Queue = mp.get_context("spawn").Queue()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spend_many, args=(path, w, 30, q)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    successes = sum(q.get(timeout=5) for _ in procs)
    assert successes == 50  # 120 attempts of 0.1 against ε = 5: exactly 50 fit
    con = sqlite3.connect(path)
    assert con.execute("SELECT COUNT(*), SUM(epsilon_units) FROM requests").fetchone() == (50, 5 * 10**12)
    assert con.execute("SELECT spent_units FROM budgets").fetchone()[0] == 5 * 10**12


def test_group_commit_batches_queued_charges_in_arrival_order(tmp_path: Path) -> None:
    import threading
    import time

    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)
    out: dict[str, Any] = {}

    def charge(name: str, rid: str, eps: float) -> None:
        try:
            out[name] = led.charge("u", rid, b"fp", eps, _resp(name))
        except Exception as exc:
            out[name] = exc

    with led._write_lock:  # hold the writers back until all five have queued
        threads = []
        for name, rid, eps in [
            ("a", "r1", 0.5),
            ("b", "r1", 0.5),
            ("c", "r2", 0.4),
            ("d", "r3", 0.2),
            ("e", "r4", 0.1),
        ]:
            threads.append(threading.Thread(target=charge, args=(name, rid, eps)))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while led._group_commit.queued() < len(threads) and time.monotonic() < deadline:  # keep arrival order
                time.sleep(0.001)
        assert led._group_commit.queued() == 5
    for t in threads:
        t.join(10)
    assert led.commits == 1  # one transaction, one fsync for all five
    assert said(out["a"], 6) == "a|0.500000" and not out["a"].replayed
    assert said(out["b"], 6) == "a|0.500000" and out["b"].replayed  # same request: the stored answer
    assert said(out["c"], 6) == "c|0.100000"
    assert isinstance(out["d"], BudgetExceeded)  # 0.9 spent: 0.2 does not fit, nothing spent
    assert said(out["e"], 6) == "e|0.000000"
    assert led.user("u").spent == pytest.approx(1.0) and led.lookup("u", "r3") is None


def test_many_threads_never_overspend(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    led = SQLiteLedger(tmp_path / "l.db", budget=5.0)

    def one(i: int) -> bool:
        try:
            led.charge("hot", f"r{i}", b"f", 0.1, _resp("x"))
            return True
        except BudgetExceeded:
            return False

    with ThreadPoolExecutor(16) as pool:
        ok = sum(pool.map(one, range(200)))
    assert ok == 50 and led.user("hot").spent == pytest.approx(5.0) and led.user("hot").requests == 50


def test_one_writer_connection_and_the_table_layout(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    led = SQLiteLedger(tmp_path / "l.db", budget=100.0)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: led.charge(f"u{i % 3}", f"r{i}", b"f", 0.5, _resp("x")), range(40)))
    writer = led._writer_conn()
    assert writer.execute("SELECT COUNT(*) FROM requests").fetchone() == (40,)
    sql = dict(writer.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall())
    assert "WITHOUT ROWID" in sql["budgets"] and "WITHOUT ROWID" not in sql["requests"]  # requests: appended
    assert writer.execute("SELECT request_id FROM requests ORDER BY rowid").fetchall() == [  # in commit order
        (r,) for (r,) in writer.execute("SELECT request_id FROM requests ORDER BY created, rowid")
    ]
    assert led.totals() == {"u0": pytest.approx(7.0), "u1": pytest.approx(6.5), "u2": pytest.approx(6.5)}


def test_group_commit_counts_each_spend_in_one_transaction(tmp_path: Path) -> None:
    import threading
    import time

    led = SQLiteLedger(tmp_path / "l.db", budget=1.0)
    led.charge("u", "r0", b"fp", 0.1, _resp("z"))  # an existing row: the batch's upsert updates it
    out: dict[str, Any] = {}

    def charge(name: str, user: str, rid: str, build) -> None:
        try:
            out[name] = led.charge(user, rid, b"fp", 0.2, build)
        except Exception as exc:
            out[name] = exc

    jobs = [
        ("a", "u", "r1", _resp("a")),
        ("c", "u", "r3", _resp("c")),
        ("d", "v", "r1", _resp("d")),
        ("e", "v", "r2", _resp("e")),
    ]
    with led._write_lock:  # hold the writers back until all four have queued
        threads = []
        for job in jobs:
            threads.append(threading.Thread(target=charge, args=job))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while led._group_commit.queued() < len(threads) and time.monotonic() < deadline:
                time.sleep(0.001)
        assert led._group_commit.queued() == 4
    for t in threads:
        t.join(10)
    assert led.commits == 2  # the first charge, then the whole batch in one transaction
    assert said(out["a"], 6) == "a|0.700000" and said(out["c"], 6) == "c|0.500000"
    assert said(out["e"], 6) == "e|0.600000"
    assert led.user("u").spent == pytest.approx(0.5) and led.user("u").requests == 3
    assert led.user("v").spent == pytest.approx(0.4) and led.user("v").requests == 2


def test_a_request_stored_by_another_process_after_its_precheck_is_decided_against_it(tmp_path: Path) -> None:
    """The transaction first decides a batch as if none of it were stored (each item was new at
    its pre-check); a request another process stored meanwhile is found (by the INSERT's unique
    key, or by a probe when the item was refused) and the batch is decided again against it."""
    from recsvc.ledger.charging import Pending
    from recsvc.ledger.units import charge_units

    led, other = SQLiteLedger(tmp_path / "l.db", budget=1.0), SQLiteLedger(tmp_path / "l.db", budget=1.0)
    other.charge("u", "a", b"da", 0.2, _resp("A"))  # another process, after our pre-checks
    other.charge("u", "s", b"ds", 0.5, _resp("S"))

    def commit(*items: tuple[str, bytes, float]) -> list[object]:
        ps = [Pending("u", rid, led.fingerprint(d), charge_units(eps), drawn=_resp(rid)) for rid, d, eps in items]
        led._group_commit(ps)  # straight to the transaction, as after a pre-check that found nothing
        return [p.error.__class__.__name__ if p.error else (said(p.result, 6), p.result.replayed) for p in ps]

    # The INSERT meets the stored "a": decided again, "a" replays and "n" alone is charged.
    assert commit(("n", b"dn", 0.2), ("a", b"da", 0.1)) == [("n|0.100000", False), ("A|0.800000", True)]
    # "s" does not fit the budget left, but it is stored: a replay, not a refusal.
    assert commit(("s", b"ds", 0.9)) == [("S|0.300000", True)]
    # Stored with another fingerprint: a conflict, nothing spent; the later item still charged.
    assert commit(("a", b"zz", 0.05), ("m", b"dm", 0.05)) == ["RequestConflict", ("m|0.050000", False)]
    assert (led.user("u").spent_units, led.user("u").requests) == (950_000_000_000, 4)
    assert [r for (r,) in led._conn().execute("SELECT request_id FROM requests ORDER BY rowid")] == ["a", "s", "n", "m"]
    stored = led.lookup("u", "a")
    assert stored is not None and said(Charge(stored.answer, False)) == "A|0.800000" and led.commits == 3


def test_the_precheck_reads_the_latest_commit_on_either_connection_and_never_waits_for_a_commit(
    tmp_path: Path,
) -> None:
    """The pre-check reads on the writer's connection when no commit holds it, else on the
    thread's own: either way it sees every commit (this process's and another's), and a replay or
    a refusal is answered without drawing and without waiting for the commit in progress."""
    import threading

    led, other = SQLiteLedger(tmp_path / "l.db", budget=1.0), SQLiteLedger(tmp_path / "l.db", budget=1.0)
    draws: list[str] = []

    def draw_and_charge(rid: str, digest: bytes, eps: float) -> object:
        try:
            c = drawn_charge(led, "u", rid, digest, eps, lambda: draws.append(rid), tag=rid)
            return (said(c, 1), c.replayed)
        except Exception as exc:
            return type(exc).__name__

    assert draw_and_charge("a", b"da", 0.5) == ("a|0.5", False)  # the writer connection now exists
    other.charge("u", "b", b"db", 0.3, _resp("B"))  # another process commits after it
    assert draw_and_charge("b", b"db", 0.3) == ("B|0.2", True)  # seen on the warm writer connection
    out: list[object] = []
    with led._write_lock:  # a commit in progress: the pre-check must not wait for it
        other.charge("u", "c", b"dc", 0.1, _resp("C"))
        t = threading.Thread(
            target=lambda: out.extend(
                [draw_and_charge("c", b"dc", 0.1), draw_and_charge("a", b"zz", 0.5), draw_and_charge("d", b"dd", 0.2)]
            )
        )
        t.start()
        t.join(10)
        assert not t.is_alive()
    assert out == [("C|0.1", True), "RequestConflict", "BudgetExceeded"]  # 0.9 spent: 0.2 does not fit
    assert draws == ["a"]  # only the fresh charge drew
    assert (led.user("u").spent_units, led.user("u").requests) == (900_000_000_000, 3)


def test_a_commit_that_must_not_wait_refuses_at_once_when_another_process_holds_the_lock(tmp_path: Path) -> None:
    """Under without_waiting (the service's lone call on its event loop, F5), a commit that would
    wait for SQLite's write lock (another process) or the store's own (another thread) raises
    WouldWait at once, nothing stored or spent; without it the commit waits and goes through."""
    import subprocess
    import sys
    import threading

    from recsvc.ledger import WouldWait, without_waiting

    path = tmp_path / "l.db"
    led = SQLiteLedger(path, 1.0)
    led.charge("u", "r0", b"d0", 0.25, _resp("r0"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with without_waiting(), pytest.raises(WouldWait, match="locked by another process"):
            led.charge("u", "r1", b"d1", 0.25, _resp("r1"))
        assert (led.user("u").spent_units, led.lookup("u", "r1")) == (250_000_000_000, None)
        waited: list[bool] = []
        t = threading.Thread(target=lambda: waited.append(led.charge("u", "r1", b"d1", 0.25, _resp("r1")).replayed))
        t.start()  # waits for the lock, in its thread
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(10)
    t.join(30)
    assert waited == [False] and led.user("u").spent_units == 500_000_000_000
    with led._write_lock:  # another thread's commit in progress
        with without_waiting(), pytest.raises(WouldWait, match="another thread"):
            led.charge("u", "r2", b"d2", 0.25, _resp("r2"))
    assert led.charge("u", "r2", b"d2", 0.25, _resp("r2")).replayed is False  # nothing was left queued
    led.close()
