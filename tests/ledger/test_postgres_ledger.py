"""The PostgreSQL ledger's own checks: settings shared by replicas, schema versions, bad URLs, the
`recsvc ledger` commands and the per-connection durability setting."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.checks import ParamError
from recsvc.ledger import BudgetExceeded
from recsvc.ledger.postgres import PostgresLedger
from recsvc.ledger.postgres.schema import MIGRATIONS, key_check
from recsvc.ledger.testing import Stores, resp
from recsvc.ledger.units import charge_units
from recsvc.service.testing import free_port, run_recsvc
from recsvc.v1 import selection_pb2 as pb


def _open(s: Stores, **settings: Any) -> PostgresLedger:
    """A replica of the PostgreSQL ledger ``s`` names."""
    return cast(PostgresLedger, s.open(**settings))


def _lock_waiters(conn: psycopg.Connection[Any]) -> int:
    """How many server backends wait for a lock."""
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
    assert row is not None
    return row[0]


def test_replicas_must_agree_on_budget_and_key(pg_cluster, tmp_path: Path) -> None:
    url = pg_cluster.new_database()
    s = Stores(url, tmp_path / "k")
    s.open(budget=1.0).close()
    with pytest.raises(ParamError, match=r"differs from the budget ε=1 .*same budget"):
        PostgresLedger(url, 2.0, tmp_path / "k")
    (tmp_path / "other").write_text("ab" * 32 + "\n")
    (tmp_path / "other").chmod(0o600)
    with pytest.raises(ParamError, match=r"not the key the ledger .* was initialised with"):
        PostgresLedger(url, 1.0, tmp_path / "other")
    led = PostgresLedger(url, 1.0, tmp_path / "k")  # the same settings: accepted
    with led._pool.connection() as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    led.close()


def test_a_pooled_connection_runs_its_statements_on_one_cursor(pg_cluster, tmp_path: Path) -> None:
    led = _open(Stores(pg_cluster.new_database(), tmp_path / "k"), budget=1.0)
    led.charge("u", "r1", b"d", 0.25, resp("a"))
    with led._pool.connection() as conn:
        first = conn.run("SELECT %s::int", (1,))
        assert first.fetchall() == [(1,)]
        assert conn.run("SELECT %s::text", ("x",)) is first and first.fetchall() == [("x",)]
        assert conn.run("SHOW synchronous_commit").fetchone() == ("on",)  # configured like every pooled one
    assert led.user("u").spent_units == charge_units(0.25)
    led.close()


def test_uninitialised_and_newer_schemas_are_refused(
    pg_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = pg_cluster.new_database()
    key = tmp_path / "k"
    key.write_text("cd" * 32 + "\n")
    key.chmod(0o600)
    with pytest.raises(ParamError, match=r"holds no recsvc ledger yet.*recsvc ledger init"):
        PostgresLedger(url, 1.0, key)
    PostgresLedger(url, 1.0, key, create=True).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE recsvc_meta SET value='5' WHERE name='schema_version'")
    with pytest.raises(ParamError, match="schema version 5, newer than this recsvc reads"):
        PostgresLedger(url, 1.0, key)
    capsys.readouterr()
    assert recsvc_main(["ledger", "migrate", "--ledger", url]) == 2  # the command's main, in this process
    err = capsys.readouterr().err
    assert "newer than this recsvc reads" in err, err


def test_unreachable_or_malformed_url_names_host_and_port_never_the_password(tmp_path: Path) -> None:
    key = tmp_path / "k"
    port = free_port()  # nothing listens there
    with pytest.raises(ParamError) as err:
        PostgresLedger(f"postgresql://alice:s3cr3tpw@127.0.0.1:{port}/db", 1.0, key, create=True)
    text = str(err.value)
    assert f"127.0.0.1:{port}/db" in text and "s3cr3tpw" not in text and "cannot connect" in text
    assert not key.exists()  # a failed start leaves no new key behind
    with pytest.raises(ParamError) as err:
        PostgresLedger("postgresql://alice:s3cr3tpw@127.0.0.1:notaport/db?bogus=1", 1.0, key, create=True)
    assert "s3cr3tpw" not in str(err.value)
    # A process of its own: its stderr holds whatever its loggers print too, which must not show the password.
    proc = run_recsvc(
        "ledger", "init", "--ledger", f"postgresql://alice:s3cr3tpw@127.0.0.1:{port}/db", "--fingerprint-key", str(key)
    )
    assert proc.returncode == 2 and f"127.0.0.1:{port}" in proc.stderr and "s3cr3tpw" not in proc.stderr, proc.stderr


def test_ledger_init_and_migrate_commands(pg_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_cluster.new_database()
    key = tmp_path / "replica.key"
    init = ["ledger", "init", "--ledger", url, "--fingerprint-key", str(key), "--budget"]
    assert recsvc_main([*init, "3"]) == 0
    first = capsys.readouterr()
    assert "is ready (budget ε=3" in first.out, first.err
    assert key.stat().st_mode & 0o777 == 0o600
    assert recsvc_main([*init, "3"]) == 0  # idempotent
    capsys.readouterr()
    assert recsvc_main([*init, "4"]) == 2
    assert "every process on one ledger must use the same budget" in capsys.readouterr().err
    assert recsvc_main(["ledger", "migrate", "--ledger", url]) == 0
    mig = capsys.readouterr()
    assert "schema version 4 -> 4" in mig.out, mig.err
    assert recsvc_main(["ledger", "init", "--ledger", url, "--budget", "3"]) == 2
    nokey = capsys.readouterr().err
    assert "needs --fingerprint-key" in nokey, nokey


def test_a_version_1_database_migrates_to_the_current_version(
    pg_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database as version 1 left it (schema, settings, charges with SelectResponse answers) gets the
    window column, the lifetime window setting, and each charge's answer typed, its mechanism read
    from its stored response; one unreadable response refuses the migration, nothing changed."""
    url = pg_cluster.new_database()
    key = tmp_path / "k"
    key.write_text("ef" * 32 + "\n")
    key.chmod(0o600)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE recsvc_meta (name text PRIMARY KEY, value text NOT NULL)")
        conn.execute(
            "INSERT INTO recsvc_meta VALUES ('schema_version', '1'), ('budget_units', %s), ('key_check', %s)",
            (str(10**12), key_check(bytes.fromhex("ef" * 32))),
        )
        for sql in MIGRATIONS[1]:
            conn.execute(sql)
        for i, mech in enumerate(["rnm", "gem", "combined_gem"] * 200):  # 600 rows: more than one page of 512
            resp = pb.SelectResponse(item_id="x", mechanism=mech, epsilon_spent=0.001, request_id=f"r{i:03d}")
            conn.execute(
                "INSERT INTO recsvc_requests VALUES (%s, %s, %s, %s, %s)",
                (f"u{i % 7}", f"r{i:03d}", b"fp", 10**9, resp.SerializeToString()),
            )
        conn.execute("INSERT INTO recsvc_requests VALUES ('odd', 'r', 'fp', 1, '\\xff00')")  # not a SelectResponse
        conn.execute("INSERT INTO recsvc_budgets VALUES ('u0', 86000000000, 86)")
    with pytest.raises(ParamError, match="schema version 1, older than this recsvc's 4; run `recsvc ledger migrate"):
        PostgresLedger(url, 1.0, key)
    capsys.readouterr()
    assert recsvc_main(["ledger", "migrate", "--ledger", url]) == 2
    assert "user_id 'odd' request_id 'r' cannot be read" in capsys.readouterr().err
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT value FROM recsvc_meta WHERE name='schema_version'").fetchone() == ("1",)
        conn.execute("DELETE FROM recsvc_requests WHERE user_id = 'odd'")
    assert recsvc_main(["ledger", "migrate", "--ledger", url]) == 0
    mig = capsys.readouterr()
    assert "schema version 1 -> 4" in mig.out, mig.err
    with psycopg.connect(url, autocommit=True) as conn:
        counts: dict[str, int] = dict(
            conn.execute("SELECT mechanism, count(*) FROM recsvc_requests GROUP BY 1").fetchall()
        )
        assert counts == {"rnm": 200, "gem": 200, "combined_gem": 200}
        assert conn.execute(
            "SELECT item_ids, item_rows, epsilon_spent, budget_remaining FROM recsvc_requests WHERE request_id = 'r599'"
        ).fetchall() == [('["x"]', "[]", 0.001, 0.0)]
        assert conn.execute("SELECT spent_units, requests, window_start FROM recsvc_budgets").fetchall() == [
            (86 * 10**9, 86, 0)
        ]
        assert conn.execute("SELECT value FROM recsvc_meta WHERE name='budget_window'").fetchone() == ("lifetime",)
    with pytest.raises(ParamError, match="budget_window 1d differs from the budget window lifetime"):
        PostgresLedger(url, 1.0, key, window="1d")
    led = PostgresLedger(url, 1.0, key)
    assert (led.user("u0").spent_units, led.user("u0").requests, led.user("u0").window_end) == (86 * 10**9, 86, 0)
    led.close()
    assert recsvc_main(["ledger", "migrate", "--ledger", url]) == 0
    again = capsys.readouterr()
    assert "schema version 4 -> 4" in again.out, again.err


def test_a_database_of_stored_responses_replays_every_answer_byte_for_byte_after_migration(
    pg_cluster, tmp_path: Path, v4_ledger: Any
) -> None:
    """The SQLite fixture's charges, as a version-3 database stores them (the same response
    bytes), replay byte for byte after `recsvc ledger migrate`."""
    sqlite_copy = v4_ledger.copy_to(tmp_path)
    key = sqlite_copy.with_name(sqlite_copy.name + ".key")
    with sqlite3.connect(sqlite_copy) as lite:
        rows = lite.execute(
            "SELECT user_id, request_id, fingerprint, epsilon_units, response, mechanism FROM requests ORDER BY rowid"
        ).fetchall()
        budgets = lite.execute("SELECT user_id, spent_units, requests FROM budgets").fetchall()
    url = pg_cluster.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE recsvc_meta (name text PRIMARY KEY, value text NOT NULL)")
        conn.execute(
            "INSERT INTO recsvc_meta VALUES ('schema_version', '3'), ('budget_units', %s), ('key_check', %s), "
            "('budget_window', 'lifetime')",
            (str(charge_units(v4_ledger.budget)), key_check(bytes.fromhex(key.read_text().strip()))),
        )
        for v in (1, 2, 3):
            for sql in MIGRATIONS[v]:
                conn.execute(sql)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO recsvc_requests(user_id, request_id, fingerprint, epsilon_units, response, mechanism) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                rows,
            )
            cur.executemany("INSERT INTO recsvc_budgets(user_id, spent_units, requests) VALUES (%s, %s, %s)", budgets)
    assert recsvc_main(["ledger", "migrate", "--ledger", url]) == 0
    led = PostgresLedger(url, v4_ledger.budget, key, pool_size=1)
    try:
        v4_ledger.check_replays(led)
    finally:
        led.close()


def test_charges_behind_a_locked_row_wait_in_their_own_threads_and_each_is_decided_once(
    pg_cluster, tmp_path: Path
) -> None:
    """While another replica holds the user's row lock, this process's rounds never wait on it:
    each of the user's charges is set aside and waits in its own caller's thread (five lock
    waiters, nothing queued for a round), another user's charge commits meanwhile, and once the
    lock is released each is decided against what the ones before it left: exactly the budget."""
    import threading
    import time

    from recsvc.ledger import BudgetExceeded

    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    led = _open(s, budget=1.0)
    led.charge("u", "r0", b"f0", 0.1, resp("first"))
    out: dict[str, Any] = {}

    def charge(rid: str, eps: float) -> None:
        try:
            out[rid] = led.charge("u", rid, rid.encode(), eps, resp(rid))
        except Exception as exc:
            out[rid] = exc

    other = psycopg.connect(str(s.target))  # "another replica", mid-transaction on the user's row
    other.execute("SELECT * FROM recsvc_budgets WHERE user_id='u' FOR UPDATE")
    threads = [
        threading.Thread(target=charge, args=(rid, eps))
        for rid, eps in [("r1", 0.3), ("r2", 0.3), ("r3", 0.2), ("r4", 0.2), ("r5", 0.1)]
    ]
    deadline = time.monotonic() + 10
    with psycopg.connect(str(s.target), autocommit=True) as watch:
        for n, t in enumerate(threads, start=1):
            t.start()
            while time.monotonic() < deadline and _lock_waiters(watch) < n:
                time.sleep(0.005)
        assert (_lock_waiters(watch), led._group_commit.queued()) == (5, 0)
    assert led.charge("w", "x", b"x", 0.5, resp("w")).replayed is False  # another user: not stalled
    other.rollback()
    other.close()
    for t in threads:
        t.join(20)
    charged = {r for r, o in out.items() if not isinstance(o, Exception)}
    refused = {r for r, o in out.items() if isinstance(o, BudgetExceeded)}
    eps = {"r1": 0.3, "r2": 0.3, "r3": 0.2, "r4": 0.2, "r5": 0.1}
    assert charged | refused == set(eps) and all(not out[r].replayed for r in charged)
    assert all(led.lookup("u", r) is None for r in refused)
    spent = led.user("u").spent_units
    assert spent == charge_units(0.1) + sum(charge_units(eps[r]) for r in charged) and spent <= 10**12
    assert led.user("u").requests == 1 + len(charged) and led.user("w").spent_units == charge_units(0.5)
    s.close_all()


def test_the_health_probe_keeps_one_connection_open(pg_cluster, tmp_path: Path) -> None:
    """reachable() (polled every second by each replica's health watcher) reuses one connection
    instead of opening a new server backend per probe, and replaces it when it dies."""
    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    led = _open(s, budget=1.0)
    sql = "SELECT pid FROM pg_stat_activity WHERE application_name = 'recsvc-probe' AND datname = current_database()"
    with psycopg.connect(str(s.target), autocommit=True) as watch:

        def probes(want: int) -> list[tuple]:  # a backend leaves pg_stat_activity a moment after it ends
            deadline = time.monotonic() + 10
            while len(rows := watch.execute(sql).fetchall()) != want and time.monotonic() < deadline:
                time.sleep(0.02)
            return rows

        assert probes(0) == []
        assert all(led.reachable() for _ in range(5))
        first = probes(1)
        assert len(first) == 1  # five probes, one backend
        watch.execute("SELECT pg_terminate_backend(%s, 5000)", (first[0][0],))  # as a server restart would
        assert probes(0) == []
        assert led.reachable()  # the dead connection is replaced within the same probe
        second = probes(1)
        assert len(second) == 1 and second != first
        led.close()
        assert probes(0) == []
    s.close_all()


def test_a_replica_with_a_fast_clock_does_not_renew_early(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget windows are decided by the database's clock: a replica whose own clock runs a day
    fast charges in the database's current window, not in tomorrow's."""
    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    honest = _open(s, budget=1.0, window="1d")
    honest.charge("u", "r1", b"f1", 1.0, resp("a"))
    window = honest.user("u").window_start
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86_400)  # this host's clock: a day fast
    fast = _open(s, budget=1.0, window="1d")
    with pytest.raises(BudgetExceeded):
        fast.charge("u", "r2", b"f2", 0.5, resp("b"))
    assert (fast.user("u").window_start, fast.user("u").spent_units) == (window, 10**12)
    # The same replica on its local clock would have renewed: what the database's clock prevents.
    local = _open(s, budget=1.0, window="1d", clock=time.time)
    assert local.user("u").spent_units == 0 and local.user("u").window_start == window + 86_400


def test_a_passfile_logs_in_and_a_password_in_the_url_is_warned_about(
    pg_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    role, password = f"pw{os.getpid()}", "pw-S3cret-42"
    pg_cluster.password_role(role, password)
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {role} OWNER {role}")
    url = f"postgresql://{role}@127.0.0.1:{pg_cluster.port}/{role}"
    key = tmp_path / "k"
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))  # never this user's own ~/.pgpass
    with pytest.raises(ParamError, match=r"cannot connect .*password"):
        PostgresLedger(url, 1.0, key, create=True)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{pg_cluster.port}:{role}:{role}:{password}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with caplog.at_level(logging.WARNING):
        PostgresLedger(url, 1.0, key, create=True).close()  # the password comes from the passfile
        assert "holds a password" not in caplog.text
        monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
        with_password = f"postgresql://{role}:{password}@127.0.0.1:{pg_cluster.port}/{role}"
        PostgresLedger(with_password, 1.0, key).close()
    warning = f"--ledger for 127.0.0.1:{pg_cluster.port}/{role} holds a password: any local user can read it"
    assert warning in caplog.text and password not in caplog.text


def test_the_database_clock_reads_again_in_the_background(pg_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from recsvc.ledger.postgres import clock as clock_mod
    from recsvc.ledger.postgres.schema import connect

    url = pg_cluster.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        db_now = row[0]
        c = clock_mod.DatabaseClock(lambda: connect(url, "db", 5), conn)
    assert abs(c() - db_now) < 5
    monkeypatch.setattr(clock_mod, "RESYNC_S", 0.0)
    old = c._base
    c()  # stale: a reading starts in its own thread, and this call returns at once
    deadline = time.monotonic() + 10
    while c._base == old and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c._base != old and abs(c() - time.time()) < 5  # the cluster runs on this host's clock
