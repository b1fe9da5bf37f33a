"""Renewable budgets beyond the store conformance suite: the flag, the SQLite file's version-2
migration from a real version-1 file, SelectBatch's one-transaction path across a window
boundary, and GetBudget / `recsvc budget` reporting the window."""

from __future__ import annotations

import hmac
import json
import sqlite3
import time
from pathlib import Path

import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.checks import ParamError
from recsvc.ledger import BatchItem, BudgetExceeded, Charge, Drawn, RequestConflict
from recsvc.ledger.export import export
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.ledger.testing import DAY, Clock, resp, said
from recsvc.ledger.window import BudgetWindow
from recsvc.service import workers
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import start
from recsvc.service.testing import candidates
from recsvc.v1 import selection_pb2 as pb

# Verbatim the version-1 SQLite schema (the file format without renewable budgets).
V1_SCHEMA = """
CREATE TABLE budgets (
    user_id     TEXT PRIMARY KEY,
    spent_units INTEGER NOT NULL,
    requests    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE requests (
    user_id       TEXT NOT NULL,
    request_id    TEXT NOT NULL,
    fingerprint   BLOB NOT NULL,
    epsilon_units INTEGER NOT NULL,
    response      BLOB NOT NULL,
    created       REAL NOT NULL,
    PRIMARY KEY (user_id, request_id)
) WITHOUT ROWID;
PRAGMA user_version = 1;
"""
KEY = bytes(range(32))


@pytest.mark.parametrize(("text", "days"), [("lifetime", 0), ("1d", 1), ("7d", 7), ("30d", 30), ("36500d", 36500)])
def test_window_values(text: str, days: int) -> None:
    w = BudgetWindow.parse(text)
    assert (w.days, w.name, w.seconds) == (days, text, days * DAY)
    assert w.start(1_700_000_123.5) == (0 if days == 0 else 1_700_000_123 // (days * DAY) * days * DAY)


@pytest.mark.parametrize("bad", ["", "7", "12h", "0d", "36501d", "-1d", "1w", "Lifetime", "1.5d", "7 d"])
def test_a_bad_window_is_a_clear_error(bad: str) -> None:
    with pytest.raises(
        ParamError,
        match=r"budget_window .* is not a budget window; expected 'lifetime' or a number "
        r"of days such as 1d, 7d or 30d \(1d to 36500d; hours are not accepted\)",
    ):
        BudgetWindow.parse(bad)


def test_the_flag_is_checked_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(config: object) -> int:
        raise AssertionError("serve started with a bad --budget-window")

    monkeypatch.setattr(workers, "serve_one", never)
    monkeypatch.setattr(workers, "_serve_workers", never)
    led = tmp_path / "l.db"
    assert recsvc_main(["ledger", "init", "--ledger", str(led), "--budget-window", "12h"]) == 2
    assert "--budget-window '12h' is not a budget window" in capsys.readouterr().err
    serve = ["serve", "--artifacts", str(tmp_path), "--ledger", str(led), "--port", "0", "--budget-window", "0d"]
    assert recsvc_main(serve) == 2
    assert "--budget-window '0d' is not a budget window" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no ledger, no key
    assert recsvc_main(["ledger", "init", "--ledger", str(led), "--budget", "2", "--budget-window", "7d"]) == 0
    ok = capsys.readouterr()
    assert "budget ε=2 per user per 7d window (UTC)" in ok.out, ok.err
    assert recsvc_main(["ledger", "init", "--ledger", str(led), "--budget", "2"]) == 2
    clash = capsys.readouterr().err
    assert (
        f"--budget-window lifetime differs from the budget window 7d that the ledger {led} was created with"
    ) in clash, clash
    with pytest.raises(SystemExit) as done:
        recsvc_main(["serve", "--help"])
    help_text = capsys.readouterr().out
    assert done.value.code == 0 and "NOT over all time" in " ".join(help_text.split()) and "T·ε" in help_text


def _write_v1(path: Path) -> None:
    """A version-1 ledger as recsvc wrote it: keyed fingerprints, integer units, SelectResponse answers."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(V1_SCHEMA)
    rows = [
        ("alice", "a1", "rnm", 300_000_000_000),
        ("alice", "a2", "gem", 200_000_000_000),
        ("bob", "b1", "pf", 1_000_000_000_000),
    ]
    for user, rid, mech, units in rows:
        resp = pb.SelectResponse(item_id="it1", mechanism=mech, epsilon_spent=units / 1e12, request_id=rid)
        con.execute(
            "INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?)",
            (user, rid, hmac.digest(KEY, f"d-{rid}".encode(), "sha256"), units, resp.SerializeToString(), 1.7e9),
        )
    con.executemany("INSERT INTO budgets VALUES (?, ?, ?)", [("alice", 500_000_000_000, 2), ("bob", 10**12, 1)])
    con.close()
    key = path.with_name(path.name + ".key")
    key.write_text(KEY.hex() + "\n")
    key.chmod(0o600)


def test_a_version_1_file_migrates_to_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _write_v1(path)
    with pytest.raises(ParamError, match="budget_window 7d differs from the budget window lifetime"):
        SQLiteLedger(path, 1.0, window="7d")  # a v1 file counted ε over all time: refused, and left as it was
    with pytest.raises(ParamError, match=r"format version 1; expected a ledger of version 5: open it once"):
        export(path, tmp_path / "c.parquet")  # the audit export reads only the current format
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone() == (1,)
    assert con.execute("SELECT name FROM sqlite_master WHERE name='settings'").fetchall() == []
    con.close()
    led = SQLiteLedger(path, 1.0)
    conn = led._conn()
    assert conn.execute("PRAGMA user_version").fetchone() == (5,)
    assert conn.execute("SELECT user_id, request_id, mechanism FROM requests ORDER BY 1, 2").fetchall() == [
        ("alice", "a1", "rnm"),
        ("alice", "a2", "gem"),
        ("bob", "b1", "pf"),
    ]
    assert conn.execute("SELECT user_id, spent_units, requests, window_start FROM budgets ORDER BY 1").fetchall() == [
        ("alice", 500_000_000_000, 2, 0),
        ("bob", 10**12, 1, 0),
    ]
    assert conn.execute("SELECT value FROM settings WHERE name='budget_window'").fetchone() == ("lifetime",)
    alice = led.user("alice")
    assert (alice.spent_units, alice.requests, alice.window_start, alice.window_end) == (500_000_000_000, 2, 0, 0)
    replay = led.charge("alice", "a1", _digest("a1"), 0.3, resp("NEW"))
    assert replay.replayed and replay.answer.mechanism == "rnm"
    with pytest.raises(BudgetExceeded):
        led.charge("bob", "b2", b"x", 0.1, resp("x"))
    led.close()
    assert SQLiteLedger(path, 1.0).commits == 0  # opening again migrates nothing
    assert export(path, tmp_path / "c.parquet", progress=False) == 3


def _digest(rid: str) -> bytes:
    """The digest whose keyed fingerprint _write_v1 stored for ``rid``."""
    return f"d-{rid}".encode()


def test_selectbatch_path_renews_at_the_window_boundary(tmp_path: Path) -> None:
    clock = Clock(19_723 * DAY + 100.0)
    led = SQLiteLedger(tmp_path / "l.db", 1.0, window="1d", clock=clock)
    draws: list[list[int]] = []

    def run(items: list[BatchItem]) -> list[Charge | Exception]:
        with led.reserve_batch(items) as r:
            draws.append(r.todo)
            return led.commit_batch(r, [Drawn((f"s{i}",)) for i in r.todo])

    first = run([BatchItem("u", f"r{i}", f"d{i}".encode(), 0.4, "rnm") for i in range(3)])
    assert [said(o, 1) if isinstance(o, Charge) else type(o) for o in first] == ["s0|0.6", "s1|0.2", BudgetExceeded]
    clock.now = 19_724 * DAY  # 00:00 UTC: the next window
    items = [
        BatchItem("u", "r0", b"d0", 0.4, "rnm"),  # charged yesterday: replayed, not drawn, not charged
        BatchItem("u", "r1", b"other", 0.4, "rnm"),  # conflict, whatever the window
        *(BatchItem("u", f"n{i}", f"e{i}".encode(), 0.4, "pf") for i in range(3)),
    ]
    second = run(items)
    assert isinstance(second[0], Charge) and (said(second[0], 1), second[0].replayed) == ("s0|0.6", True)
    assert isinstance(second[1], RequestConflict)
    fresh = [said(o, 1) if isinstance(o, Charge) else type(o) for o in second[2:4]]
    assert fresh == ["s2|0.6", "s3|0.2"] and isinstance(second[4], BudgetExceeded)
    assert draws == [[0, 1], [2, 3]]
    u = led.user("u")
    assert (u.spent_units, u.requests, u.window_start) == (800_000_000_000, 2, 19_724 * DAY)
    stored = (
        led._conn()
        .execute("SELECT request_id, mechanism, epsilon_units, created FROM requests ORDER BY created, request_id")
        .fetchall()
    )
    assert stored == [
        ("r0", "rnm", 4 * 10**11, 19_723 * DAY + 100.0),
        ("r1", "rnm", 4 * 10**11, 19_723 * DAY + 100.0),
        ("n0", "pf", 4 * 10**11, 19_724 * DAY),
        ("n1", "pf", 4 * 10**11, 19_724 * DAY),
    ]


def test_getbudget_and_the_cli_report_the_window(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=2.0, budget_window="7d"))
    try:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            before = time.time()
            r = c.select("w", candidates(), mechanism="rnm", epsilon=0.5, request_id="q1")
            assert r.budget_remaining == 1.5
            b = c.budget("w")
            after = time.time()
            starts = {int(t // (7 * DAY)) * 7 * DAY for t in (before, after)}
            assert b.window_start_unix in starts and b.window_end_unix == b.window_start_unix + 7 * DAY
            assert (b.spent, b.remaining, b.requests) == (0.5, 1.5, 1)
        capsys.readouterr()
        assert recsvc_main(["budget", "--target", f"127.0.0.1:{h.port}", "--user", "w"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["window_start_unix"] == b.window_start_unix and shown["window_end_unix"] == b.window_end_unix
        assert shown["window_start"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b.window_start_unix))
        assert shown["window_start"].endswith("T00:00:00Z") and shown["spent"] == 0.5
        assert h.ledger.lookup("w", "q1") is not None
        assert h.ledger._conn().execute("SELECT mechanism FROM requests").fetchall() == [("rnm",)]
    finally:
        h.stop(1)
    life = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "life.db"))
    try:
        assert recsvc_main(["budget", "--target", f"127.0.0.1:{life.port}", "--user", "w"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert (shown["window_start"], shown["window_end"], shown["window_start_unix"]) == (None, None, 0)
    finally:
        life.stop(1)
