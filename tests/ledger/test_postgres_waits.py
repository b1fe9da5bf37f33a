"""Bounded waits on the PostgreSQL ledger (F3): another session holding a user's budget row with
``FOR UPDATE`` stalls only that user, a charge that waits past ``lock_timeout`` is UNAVAILABLE
with nothing spent, and a commit stuck on a lock is reported as a stalled pipeline."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from recsvc.ledger import LedgerUnavailable, Waits
from recsvc.ledger.postgres import PostgresLedger
from recsvc.ledger.testing import resp
from recsvc.ledger.testing.postgres import lock_waiters, until
from recsvc.service.server import ledger_healthy


def _open(url: str, key: Path, waits: Waits) -> PostgresLedger:
    return PostgresLedger(url, 1.0, key, pool_size=4, create=True, waits=waits)


def _holding(url: str, sql: str) -> psycopg.Connection[Any]:
    """Another session, inside a transaction that holds what ``sql`` locks (the psql case)."""
    conn = psycopg.connect(url)
    conn.execute(sql)
    return conn


def test_every_pooled_connection_sets_the_three_timeouts(pg_cluster, tmp_path: Path) -> None:
    led = _open(pg_cluster.new_database(), tmp_path / "k", Waits(lock_s=1.5, statement_s=7, idle_in_transaction_s=9))
    try:
        with led._pool.connection() as conn:
            got = [
                conn.execute(f"SHOW {name}").fetchone()
                for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
            ]
        assert got == [("50ms",), ("7s",), ("9s",)]  # a round's lock wait; a set-aside charge waits lock_s
    finally:
        led.close()


# Another session's hold on alice's row: a psql FOR UPDATE, or a replica frozen after its UPDATE.
HOLDS = {
    "for-update": "SELECT * FROM recsvc_budgets WHERE user_id = 'alice' FOR UPDATE",
    "updated": "UPDATE recsvc_budgets SET requests = requests WHERE user_id = 'alice'",
}


@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_a_locked_row_stalls_only_its_user_and_times_out_with_nothing_spent(
    pg_cluster, tmp_path: Path, hold: str
) -> None:
    url = pg_cluster.new_database()
    led = _open(url, tmp_path / "k", Waits(lock_s=60.0))
    try:
        led.charge("alice", "a0", b"d0", 0.25, resp("a0"))
        led.charge("bob", "b0", b"d0", 0.25, resp("b0"))
        other = _holding(url, HOLDS[hold])
        watcher = psycopg.connect(url, autocommit=True)
        outcome: list[object] = []
        alice = threading.Thread(
            target=lambda: outcome.append(led.charge("alice", "a1", b"d1", 0.25, resp("a1")).replayed)
        )
        alice.start()
        until(lambda: lock_waiters(watcher) == 1)
        assert lock_waiters(watcher) == 1 and alice.is_alive()  # alice's charge waits on her row, in her thread
        # Bob's charges go on while alice's row is held: the round never waits on it.
        assert [led.charge("bob", f"b{i}", b"d", 0.25, resp("b")).replayed for i in (1, 2)] == [False, False]
        assert (led.user("bob").spent_units, alice.is_alive()) == (750_000_000_000, True)
        other.rollback()  # the lock is released: alice's charge goes through, once
        alice.join(10)
        assert outcome == [False] and led.user("alice").spent_units == 500_000_000_000
        other.close()
        watcher.close()
    finally:
        led.close()

    short = _open(url, tmp_path / "k", Waits(lock_s=0.2))
    other = _holding(url, HOLDS[hold])
    try:
        with pytest.raises(LedgerUnavailable, match=r"lock_timeout \(at most 0.2 s\).*retry with the same request_id"):
            short.charge("alice", "a2", b"d2", 0.25, resp("a2"))
        other.rollback()
        assert (short.user("alice").spent_units, short.lookup("alice", "a2")) == (500_000_000_000, None)
        assert short.charge("alice", "a2", b"d2", 0.25, resp("a2")).replayed is False  # the retry is charged
    finally:
        other.close()
        short.close()


def test_a_commit_stuck_on_a_frozen_database_reports_a_stalled_pipeline(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's backends serving the ledger's pool are SIGSTOPped mid-round (a frozen
    database that still accepts TCP): the round's statement waits, the ledger reports its charge
    pipeline stalled (health NOT_SERVING, though a fresh probe connection answers), and after
    SIGCONT the charge completes, once."""
    monkeypatch.setattr("recsvc.ledger.base.STALL_S", 0.05)
    url = pg_cluster.new_database()
    led = _open(url, tmp_path / "k", Waits())
    try:
        led.charge("u", "r0", b"d", 0.25, resp("r0"))
        assert ledger_healthy(led)  # opens the probe's own connection
        with psycopg.connect(url, autocommit=True) as admin:
            pids = [
                pid
                for (pid,) in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend' AND application_name <> 'recsvc-probe'"
                )
            ]
        assert len(pids) == 4  # the pool's connections
        charged: list[bool] = []
        t = threading.Thread(target=lambda: charged.append(led.charge("v", "r1", b"d", 0.25, resp("")).replayed))
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            t.start()
            until(led.stalled)
            assert led.stalled() and led.reachable() and not ledger_healthy(led)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        t.join(10)
        assert charged == [False] and not led.stalled() and ledger_healthy(led)
        assert led.user("v").spent_units == 250_000_000_000
    finally:
        led.close()


def test_the_serve_flags_reach_the_ledger(tmp_path: Path) -> None:
    from recsvc.service.config import ServerConfig

    c = ServerConfig.of(tmp_path, ledger_lock_timeout=0.5, ledger_statement_timeout=3.0, ledger_idle_timeout=4.0)
    assert c.ledger.waits == Waits(0.5, 3.0, 4.0)
    with pytest.raises(Exception, match=r"ledger_lock_timeout must be in \(0, 86400\) seconds, got 0"):
        ServerConfig.of(tmp_path, ledger_lock_timeout=0.0).check()
    assert ServerConfig.of(tmp_path).ledger.connect_timeout == 5.0
    with pytest.raises(Exception, match=r"ledger_connect_timeout must be in \(0, 86400\) seconds, got 0"):
        ServerConfig.of(tmp_path, ledger_connect_timeout=0.0).check()


def test_the_connect_timeout_reaches_the_pool_and_libpq(pg_cluster, tmp_path: Path) -> None:
    """--ledger-connect-timeout is the pool's wait for a connection and its reconnect retries, and
    libpq's connect and link timeouts (whole seconds, at least 1)."""
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start
    from recsvc.service.testing import make_artifact

    url = pg_cluster.new_database()
    PostgresLedger(url, 10.0, tmp_path / "k", create=True).close()
    config = ServerConfig.of(
        make_artifact(tmp_path / "art"), port=0, ledger=url, fingerprint_key=tmp_path / "k", ledger_connect_timeout=2.4
    )
    handle = start(config)
    try:
        pool = handle.ledger._pool
        assert (pool.timeout, pool.reconnect_timeout) == (2.4, 2.4)
        assert {k: pool.kwargs[k] for k in ("connect_timeout", "tcp_user_timeout", "keepalives_idle")} == {
            "connect_timeout": 2,
            "tcp_user_timeout": 2400,
            "keepalives_idle": 2,
        }
    finally:
        handle.stop(grace=0)


def test_a_replica_frozen_inside_its_transaction_is_ended_by_the_server(pg_cluster, tmp_path: Path) -> None:
    """A replica's ledger connection that sits inside a transaction holding a user's row (a replica
    SIGSTOPped between FOR UPDATE and COMMIT) is ended by the server after the idle timeout, its
    transaction rolled back: the row is free again and the other replica's waiting charge goes on."""
    url = pg_cluster.new_database()
    a = _open(url, tmp_path / "k", Waits(lock_s=60.0))
    frozen = _open(url, tmp_path / "k", Waits(idle_in_transaction_s=0.3))
    try:
        a.charge("u", "r0", b"d0", 0.25, resp("r0"))
        with frozen._pool.connection() as conn:  # the frozen replica's own connection, with its settings
            conn.execute("BEGIN")
            conn.execute("UPDATE recsvc_budgets SET requests = requests + 1 WHERE user_id = 'u'")
            # ... and it never commits: a's charge waits for the row until the server ends that session.
            assert a.charge("u", "r1", b"d1", 0.25, resp("r1")).replayed is False
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                conn.execute("COMMIT")  # the frozen replica's transaction was rolled back: nothing of it counts
        assert (a.user("u").spent_units, a.user("u").requests) == (500_000_000_000, 2)
    finally:
        frozen.close()
        a.close()
