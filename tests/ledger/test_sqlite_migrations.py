"""Older SQLite ledger files (version 0: float ε, unsalted SHA-256 fingerprints; version 2: requests
keyed WITHOUT ROWID) are migrated when opened."""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any, TypedDict

import grpc
import pytest

from recsvc.ledger import StoredAnswer
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.ledger.testing import resp
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import start
from recsvc.service.testing import select_request
from recsvc.v1 import selection_pb2 as pb

# Verbatim the version-0 schema (float totals and unsalted fingerprints).
V0_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    user_id  TEXT PRIMARY KEY,
    spent    REAL NOT NULL,
    requests INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS requests (
    user_id     TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    epsilon     REAL NOT NULL,
    response    BLOB NOT NULL,
    created     REAL NOT NULL,
    PRIMARY KEY (user_id, request_id)
) WITHOUT ROWID;
"""


def _old_fingerprint(req: pb.SelectRequest) -> bytes:
    """What a version-0 ledger stored as the fingerprint: SHA-256 of b"select\\0" + the deterministic serialization."""
    return hashlib.sha256(b"select\0" + req.SerializeToString(deterministic=True)).digest()


class V0Ledger(TypedDict):
    """What write_v0_ledger stored: the charged requests and their unsalted fingerprints."""

    requests: dict[str, pb.SelectRequest]  # "user_id/request_id" → the request
    digests: list[bytes]


def write_v0_ledger(path: Path, rowid_tables: bool = False) -> V0Ledger:
    """A version-0 ledger file, including the float total that swallowed 200 tiny charges."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(V0_SCHEMA.replace(") WITHOUT ROWID;", ");") if rowid_tables else V0_SCHEMA)
    spent: dict[str, float] = {}
    count: dict[str, int] = {}
    reqs: dict[str, pb.SelectRequest] = {}

    def charge(req: pb.SelectRequest) -> None:
        after = spent.get(req.user_id, 0.0) + req.epsilon  # float sums, as a version-0 ledger kept them
        resp = pb.SelectResponse(
            item_id=req.item_ids[0],
            mechanism="rnm",
            epsilon_spent=req.epsilon,
            budget_remaining=10.0 - after,
            request_id=req.request_id,
        )
        con.execute(
            "INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?)",
            (req.user_id, req.request_id, _old_fingerprint(req), req.epsilon, resp.SerializeToString(), 1.7e9),
        )
        spent[req.user_id], count[req.user_id] = after, count.get(req.user_id, 0) + 1
        reqs[f"{req.user_id}/{req.request_id}"] = req

    charge(select_request("tiny", "big", 8.0, seed=1))
    for i in range(200):
        charge(select_request("tiny", f"t{i}", 4e-16, seed=2))
    for i in range(3):
        charge(select_request("alice", f"a{i}", 0.1, seed=3 + i))
    con.executemany("INSERT INTO budgets VALUES (?, ?, ?)", [(u, s, count[u]) for u, s in spent.items()])
    con.close()
    assert spent == {"tiny": 8.0, "alice": 0.30000000000000004}  # the finding: 200 × 4e-16 vanished
    return {"requests": reqs, "digests": [_old_fingerprint(r) for r in reqs.values()]}


def _files(path: Path) -> bytes:
    return b"".join(
        f.read_bytes() for f in path.parent.glob(path.name + "*") if f.is_file() and not f.name.endswith(".key")
    )


@pytest.mark.parametrize("rowid_tables", [False, True])
def test_v0_file_is_migrated_conservatively_and_keyed(
    tmp_path: Path, rowid_tables: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Debian builds SQLite with secure_delete on by default; other builds do not: start from off,
    # so the test shows that the migration itself zeroes what it deletes.
    connect = SQLiteLedger._connect

    def insecure(self: SQLiteLedger, shared: bool = False) -> sqlite3.Connection:
        conn = connect(self, shared)
        conn.execute("PRAGMA secure_delete = OFF")
        return conn

    monkeypatch.setattr(SQLiteLedger, "_connect", insecure)
    path = tmp_path / "old.db"
    old = write_v0_ledger(path, rowid_tables)
    digests = old["digests"]
    assert all(d in _files(path) for d in digests[:3])  # the unsalted hashes are in the old file
    led = SQLiteLedger(path, budget=10.0)
    key = bytes.fromhex((tmp_path / "old.db.key").read_text())
    # Each old charge is rounded UP from its exact binary value; a user's total is the larger of
    # its float total and the sum of its requests, so the 200 swallowed charges come back.
    tiny, alice = led.user("tiny"), led.user("alice")
    assert (tiny.spent_units, tiny.requests) == (8 * 10**12 + 200, 201)
    assert (alice.spent_units, alice.requests) == (3 * 100_000_000_001, 3)
    conn = led._conn()
    assert conn.execute("PRAGMA user_version").fetchone() == (5,)  # 0 → 5 in one go
    # Every old answer is typed, its mechanism read back from its stored response; the window is lifetime.
    assert conn.execute("SELECT mechanism, COUNT(*) FROM requests GROUP BY mechanism").fetchall() == [("rnm", 204)]
    assert conn.execute("SELECT value FROM settings WHERE name='budget_window'").fetchall() == [("lifetime",)]
    assert conn.execute("SELECT SUM(epsilon_units) FROM requests").fetchone() == (8 * 10**12 + 200 + 300_000_000_003,)
    stored = {(u, r): bytes(f) for u, r, f in conn.execute("SELECT user_id, request_id, fingerprint FROM requests")}
    req = old["requests"]["alice/a0"]
    assert stored[("alice", "a0")] == hmac.digest(key, _old_fingerprint(req), "sha256")
    a0 = led.lookup("alice", "a0")
    assert a0 is not None and a0.answer == StoredAnswer((req.item_ids[0],), (), "rnm", 100_000_000_001, 0.1, 9.9)
    t0 = led.lookup("tiny", "t0")
    assert t0 is not None and t0.answer.epsilon == 4e-16  # the double it reported, below the unit
    led.close()
    # No unsalted fingerprint is left anywhere in the ledger's files (old pages zeroed, WAL emptied).
    raw = _files(path)
    assert not any(d in raw for d in digests)
    assert stat.S_IMODE(os.stat(tmp_path / "old.db.key").st_mode) == 0o600
    # Opening again changes nothing (the migration runs once).
    again = SQLiteLedger(path, budget=10.0)
    assert again.user("tiny").spent_units == 8 * 10**12 + 200 and again.commits == 0


def test_a_migrated_ledger_serves_retries_of_old_requests_over_grpc(artifact: Path, tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = write_v0_ledger(path)
    reqs = old["requests"]
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=path, budget=10.0))
    try:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            again = c.stub.Select(reqs["alice/a1"], timeout=10)  # a retry of a request stored before the migration
            assert again.replayed and again.item_id == reqs["alice/a1"].item_ids[0]
            changed = pb.SelectRequest()
            changed.CopyFrom(reqs["alice/a1"])
            changed.epsilon = 0.2
            with pytest.raises(grpc.RpcError) as info:
                c.stub.Select(changed, timeout=10)
            assert info.value.code() is grpc.StatusCode.ALREADY_EXISTS
            b = c.budget("tiny")
            assert (b.spent, b.requests) == (8.0000000002, 201)
            assert c.budget("alice").spent == 0.300000000003
    finally:
        h.stop(1)


def test_a_newer_ledger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    SQLiteLedger(path, budget=1.0).close()
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA user_version = 7")
    with pytest.raises(ValueError, match="has format version 7, newer than this recsvc reads"):
        SQLiteLedger(path, budget=1.0)


# Verbatim the version-2 schema (requests keyed WITHOUT ROWID, not the rowid table of version 3).
V2_SCHEMA = """
CREATE TABLE budgets (
    user_id      TEXT PRIMARY KEY,
    spent_units  INTEGER NOT NULL,
    requests     INTEGER NOT NULL,
    window_start INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE requests (
    user_id       TEXT NOT NULL,
    request_id    TEXT NOT NULL,
    fingerprint   BLOB NOT NULL,
    epsilon_units INTEGER NOT NULL,
    response      BLOB NOT NULL,
    created       REAL NOT NULL,
    mechanism     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (user_id, request_id)
) WITHOUT ROWID;
CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
INSERT INTO settings VALUES ('budget_window', '7d');
PRAGMA user_version = 2;
"""
V2_KEY = bytes(range(32))


def _write_v2(path: Path) -> list[tuple]:
    """A version-2 ledger (7d window) whose key order differs from its commit order; its request rows."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(V2_SCHEMA)
    rows = []
    for i, (user, rid) in enumerate([("zed", "z1"), ("alice", "a2"), ("bob", "b1"), ("alice", "a1")]):
        resp = pb.SelectResponse(item_id=f"it{i}", mechanism="rnm", epsilon_spent=0.1, request_id=rid)
        rows.append(
            (
                user,
                rid,
                hmac.digest(V2_KEY, f"d-{rid}".encode(), "sha256"),
                100_000_000_000,
                resp.SerializeToString(),
                1.7e9 + i,
                "rnm",
            )
        )
    con.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    con.executemany(
        "INSERT INTO budgets VALUES (?, ?, ?, ?)",
        [
            ("alice", 200_000_000_000, 2, 1_699_833_600),
            ("bob", 10**11, 1, 1_699_833_600),
            ("zed", 10**11, 1, 1_699_833_600),
        ],
    )
    con.close()
    key = path.with_name(path.name + ".key")
    key.write_text(V2_KEY.hex() + "\n")
    key.chmod(0o600)
    return rows


def _requests_sql(path: Path) -> str:
    with sqlite3.connect(path) as con:
        return con.execute("SELECT sql FROM sqlite_master WHERE name='requests'").fetchone()[0]


def test_a_version_2_file_migrates_to_the_rowid_requests_table(tmp_path: Path) -> None:
    from recsvc.ledger import RequestConflict
    from recsvc.ledger.export import export

    path = tmp_path / "v2.db"
    rows = _write_v2(path)

    def clock() -> float:
        return 1.7e9 + 100  # inside the file's 7d window

    with pytest.raises(ValueError, match="budget_window lifetime differs from the budget window 7d"):
        SQLiteLedger(path, 1.0, clock=clock)  # refused: the rebuild is rolled back with everything else
    assert "WITHOUT ROWID" in _requests_sql(path)
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone() == (2,)
    led = SQLiteLedger(path, 1.0, window="7d", clock=clock)
    conn = led._conn()
    assert conn.execute("PRAGMA user_version").fetchone() == (5,)
    assert "WITHOUT ROWID" not in _requests_sql(path)
    assert conn.execute("SELECT name, \"unique\" FROM pragma_index_list('requests')").fetchall() == [
        ("requests_key", 1)
    ]
    # Every row kept, its answer typed, now in commit (created) order; the key index answers in key order.
    cols = "user_id, request_id, fingerprint, epsilon_units, created, mechanism, item_ids"
    typed = [(*r[:4], *r[5:], f'["it{i}"]') for i, r in enumerate(rows)]
    assert [tuple(r) for r in conn.execute(f"SELECT {cols} FROM requests ORDER BY rowid")] == typed
    assert [r[:2] for r in conn.execute("SELECT user_id, request_id FROM requests ORDER BY user_id, request_id")] == [
        ("alice", "a1"),
        ("alice", "a2"),
        ("bob", "b1"),
        ("zed", "z1"),
    ]
    assert conn.execute("SELECT name, value FROM settings ORDER BY name").fetchall() == [
        ("budget_units", "1000000000000"),  # pinned to the budget of the first process that opened it
        ("budget_window", "7d"),
    ]
    alice = led.user("alice")
    assert (alice.spent_units, alice.requests, alice.window_start) == (200_000_000_000, 2, 1_699_833_600)
    replay = led.charge("alice", "a2", b"d-a2", 0.1, resp("NEW"))  # an old request still replays
    assert replay.replayed and replay.answer == StoredAnswer(("it1",), (), "rnm", 100_000_000_000, 0.1, 0.0)
    with pytest.raises(RequestConflict):
        led.charge("alice", "a2", b"other", 0.1, resp("NEW"))
    fresh = led.charge("alice", "a3", b"d-a3", 0.25, resp("FRESH"))
    assert not fresh.replayed and led.user("alice").spent_units == 450_000_000_000
    with pytest.raises(sqlite3.IntegrityError):  # the key is still unique
        conn.execute("INSERT INTO requests VALUES ('alice', 'a3', x'00', 1, 0, '', '[]', '[]', 0, 0)")
    led.close()
    assert SQLiteLedger(path, 1.0, window="7d", clock=clock).commits == 0  # opening again migrates nothing
    assert export(path, tmp_path / "c.parquet", progress=False) == 5


def test_a_ledger_of_stored_responses_replays_every_answer_byte_for_byte_after_migration(
    tmp_path: Path, v4_ledger: Any
) -> None:
    path = v4_ledger.copy_to(tmp_path)
    led = SQLiteLedger(path, budget=v4_ledger.budget)
    try:
        assert led._conn().execute("PRAGMA user_version").fetchone() == (5,)
        v4_ledger.check_replays(led)
    finally:
        led.close()
