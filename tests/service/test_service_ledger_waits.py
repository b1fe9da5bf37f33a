"""No call holds the event loop while it may wait on another process (F5): while another process
holds the SQLite ledger's write lock, a Select's commit waits for it in a request thread, and health
and reads answer meanwhile; health then reports the stuck charge pipeline, and SERVING again after."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from recsvc.service.client import Client
from recsvc.service.testing import candidates, served
from recsvc.v1 import selection_pb2 as pb

_HOLD_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # SQLite's one write lock, as `sqlite3 ledger.db` or another tool would
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
"""


def test_health_and_reads_answer_while_another_process_holds_the_ledger_write_lock(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("recsvc.service.server.PROBE_INTERVAL_S", 0.05)
    monkeypatch.setattr("recsvc.ledger.base.STALL_S", 0.2)
    ledger = tmp_path / "l.db"
    with served(artifact, ledger) as h, Client(f"127.0.0.1:{h.port}", retries=0, timeout=20) as c:
        assert c.select("u", candidates(), epsilon=0.5, request_id="r0").epsilon_spent == 0.5
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_WRITE_LOCK, str(ledger)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
            got: list[Any] = []
            t = threading.Thread(target=lambda: got.append(c.select("u", candidates(), epsilon=0.25, request_id="r1")))
            t.start()  # alone in the server: the call the event loop used to run, commit included
            deadline = threading.Event()
            while not h.ledger.stalled() and not deadline.wait(0.01):
                pass
            assert h.ledger.stalled() and t.is_alive()  # its commit waits for the other process's lock
            # The SQLite busy timeout is 60 s: within the client's 20 s, health and a read answer.
            assert c.budget("u").spent == 0.5
            while c.health() != "NOT_SERVING":  # the stuck charge pipeline is reported
                deadline.wait(0.02)
        finally:
            if holder.stdin is not None:
                holder.stdin.close()
            holder.wait(10)
        t.join(20)
        assert isinstance(got[0], pb.SelectResponse) and got[0].epsilon_spent == 0.25 and not got[0].replayed
        assert c.budget("u").spent == 0.75  # charged once
        while c.health() != "SERVING":
            deadline.wait(0.02)
