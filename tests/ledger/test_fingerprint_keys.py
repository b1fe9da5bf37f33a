"""Keyed request fingerprints: the ledger file alone cannot confirm a guessed request."""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.ledger import fingerprint as fingerprint_key
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import start
from recsvc.service.testing import free_port, rpc_error, select_request, server_process
from recsvc.v1 import selection_pb2 as pb


def _digest(req: pb.SelectRequest) -> bytes:
    return hashlib.sha256(b"select\0" + req.SerializeToString(deterministic=True)).digest()


def _select(target: str, req: pb.SelectRequest) -> pb.SelectResponse:
    with Client(target, retries=0) as c:
        return c.stub.Select(req, timeout=10)


def test_the_ledger_stores_only_an_hmac_under_a_0600_key(artifact: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=ledger))
    req = select_request("guessable-user", "rid-1")
    try:
        _select(f"127.0.0.1:{h.port}", req)
    finally:
        h.stop(1)
    key_file = tmp_path / "l.db.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    key = fingerprint_key.load(key_file)
    with sqlite3.connect(ledger) as con:
        (stored,) = con.execute("SELECT fingerprint FROM requests").fetchone()
        columns = {c[1] for t in ("budgets", "requests") for c in con.execute(f"PRAGMA table_info({t})")}
    # An attacker with the ledger file guesses the whole request, or any part of it, exactly.
    raw = req.SerializeToString(deterministic=True)
    guesses = [
        b"select\0" + raw,
        raw,
        req.user_id.encode(),
        req.request_id.encode(),
        "".join(req.item_ids).encode(),
        "\0".join(req.item_ids).encode(),
        np.array(req.scores).tobytes(),
        np.array(req.scores, np.float32).tobytes(),
    ]
    for g in guesses:
        assert stored not in (hashlib.sha256(g).digest(), hashlib.sha256(hashlib.sha256(g).digest()).digest())
    assert stored == hmac.digest(key, _digest(req), "sha256")  # with the key, it matches
    files = b"".join(f.read_bytes() for f in tmp_path.glob("l.db*") if f.name != "l.db.key")
    assert _digest(req) not in files and key not in files and key.hex().encode() not in files
    assert columns == {
        "user_id",
        "spent_units",
        "requests",
        "window_start",
        "request_id",
        "fingerprint",
        "epsilon_units",
        "item_ids",
        "item_rows",
        "epsilon_spent",
        "budget_remaining",
        "created",
        "mechanism",
    }  # no key column: the key is never stored


def test_restart_with_the_same_key_replays_and_another_key_conflicts(artifact: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    req = select_request("u", "r1")
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=ledger, budget=5.0))
    try:
        first = _select(f"127.0.0.1:{h.port}", req)
    finally:
        h.stop(1)
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=ledger, budget=5.0))  # the default key, <ledger>.key
    try:
        again = _select(f"127.0.0.1:{h.port}", req)
        assert again.replayed and again.item_id == first.item_id
    finally:
        h.stop(1)
    other = tmp_path / "other.key"
    fingerprint_key.load_or_create(other)
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=ledger, budget=5.0, fingerprint_key=other))
    try:
        # Documented behaviour: under a different key an old request_id is a conflict (never a
        # fresh sample, never a second charge); new request_ids work as usual.
        code, message = rpc_error(_select, f"127.0.0.1:{h.port}", req)
        assert code is grpc.StatusCode.ALREADY_EXISTS and "already used" in message
        assert not _select(f"127.0.0.1:{h.port}", select_request("u", "r2")).replayed
        assert (h.ledger.user("u").requests, h.ledger.user("u").spent_units) == (2, 10**12)
    finally:
        h.stop(1)


def test_a_missing_or_unsafe_key_is_refused_before_anything_changes(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "l.db"
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=ledger))
    try:
        _select(f"127.0.0.1:{h.port}", select_request("u", "r1"))
    finally:
        h.stop(1)
    key_file = tmp_path / "l.db.key"
    key_file.rename(tmp_path / "moved.key")
    argv = ["serve", "--artifacts", str(artifact), "--port", "0", "--ledger", str(ledger)]

    def rows() -> list[tuple]:
        with sqlite3.connect(ledger) as con:
            return con.execute("SELECT * FROM requests").fetchall() + con.execute("SELECT * FROM budgets").fetchall()

    snapshot = rows()
    assert recsvc_main(argv) == 2
    err = capsys.readouterr().err
    assert "--fingerprint-key" in err and "is missing, but the ledger" in err and err.count("\n") == 1, err
    assert not key_file.exists() and rows() == snapshot  # no new key was made for the old rows
    moved = tmp_path / "moved.key"
    moved.chmod(0o644)
    assert recsvc_main([*argv, "--fingerprint-key", str(moved)]) == 2
    assert "has mode 0o644: others may read the key; expected mode 0600" in capsys.readouterr().err
    moved.write_text("not hex\n")
    moved.chmod(0o600)
    assert recsvc_main([*argv, "--fingerprint-key", str(moved)]) == 2
    assert "is not a key; expected a file of mode 0600 holding 64 hex digits" in capsys.readouterr().err
    assert recsvc_main([*argv, "--fingerprint-key", str(tmp_path / "no-dir" / "k")]) == 2
    assert "--fingerprint-key directory" in capsys.readouterr().err


def test_all_workers_key_with_the_one_secret_made_before_forking(artifact: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    with server_process(artifact, ledger, "--workers", "2", port=free_port()) as srv:
        req = select_request("w", "shared-1")
        first = _select(srv.target, req)
        # Each Client is a new connection; SO_REUSEPORT spreads them over both workers. Under two
        # different keys about half of these retries would be ALREADY_EXISTS.
        for _ in range(16):
            again = _select(srv.target, req)
            assert again.replayed and again.item_id == first.item_id
        # Concurrent duplicates of a NEW request over 16 connections (both workers): whichever
        # worker commits first, every caller gets that one stored answer and it is charged once.
        burst = select_request("w", "burst-1", seed=2)
        with ThreadPoolExecutor(16) as pool:
            out = list(pool.map(lambda _: _select(srv.target, burst), range(16)))
        assert len({r.item_id for r in out}) == 1 and sorted(r.replayed for r in out) == [False] + [True] * 15
        with Client(srv.target) as c:
            b = c.budget("w")
        assert (b.requests, b.spent) == (2, 1.0)
    assert stat.S_IMODE(os.stat(tmp_path / "l.db.key").st_mode) == 0o600
    assert [p.name for p in tmp_path.glob("*.key")] == ["l.db.key"]
