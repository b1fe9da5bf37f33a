"""The SQLite ledger's files: a full disk refuses charges UNAVAILABLE with one log line and loses
nothing (F8), and a ledger others can read is warned about while its -wal/-shm stay 0600 (F10)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.ledger.testing import resp

# Run in a child process: RLIMIT_FSIZE bounds every file the process writes (root included), so the
# ledger's WAL hits the limit as it would a full disk; SIGXFSZ is ignored so write() fails instead.
_FULL_DISK = """
import json, logging, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s", stream=sys.stdout)
from recsvc.ledger import LedgerUnavailable
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.ledger.testing import resp
path = sys.argv[1]
led = SQLiteLedger(path, 100.0)
led.charge("u", "r0", b"d0", 0.5, resp("first"))
limit = os.path.getsize(path + "-wal") + 16_384
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
out = []
for i in range(1, 8):  # answers of 4 kB: the WAL passes the limit within a few commits
    try:
        out.append(led.charge("u", f"r{i}", b"d", 0.5, resp(str(i) * 4096)).replayed)
    except LedgerUnavailable as exc:
        out.append(str(exc))
refused = [i for i, o in enumerate(out, start=1) if isinstance(o, str)]
spent_while_full = led.user("u").spent_units
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # room again
retried = [led.charge("u", f"r{i}", b"d", 0.5, resp("again")).replayed for i in refused]
print(json.dumps({"out": out, "refused": refused, "spent_while_full": spent_while_full, "retried": retried}))
"""


def test_a_full_disk_refuses_unavailable_with_one_log_line_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    run = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path)], capture_output=True, text=True, timeout=120, check=True
    )
    lines = run.stdout.splitlines()
    got = json.loads(lines[-1])
    logs = [line for line in lines if line.startswith("LOG ")]
    refused, out = got["refused"], got["out"]
    assert refused and refused == list(range(refused[0], 8)), out  # once full, every charge is refused
    assert all("disk is full or failing" in out[i - 1] and "nothing was spent" in out[i - 1] for i in refused)
    charged_before = 1 + (refused[0] - 1)  # r0 and the charges that fit
    assert got["spent_while_full"] == charged_before * 500_000_000_000  # a refused charge spent nothing
    assert got["retried"] == [False] * len(refused)  # once there is room, each retry is charged, once
    assert len(logs) == 2, logs  # one line when the disk refused, one when it stored again; no stack trace
    assert "cannot store charges" in logs[0] and "stores charges again" in logs[1] and "Traceback" not in run.stderr
    led = SQLiteLedger(path, 100.0)  # reopened: every charge is there, none twice
    try:
        assert (led.user("u").spent_units, led.user("u").requests) == (8 * 500_000_000_000, 8)
    finally:
        led.close()


def _mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def test_a_ledger_others_can_read_is_warned_about_and_its_sidecars_are_0600(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.db"
    SQLiteLedger(path, 1.0).close()
    assert _mode(path) == 0o600
    os.chmod(path, 0o644)  # e.g. copied or restored with the default umask
    wal = path.with_name(path.name + "-wal")
    wal.unlink(missing_ok=True)
    wal.touch(0o644)  # a sidecar left with the file's old mode
    os.chmod(wal, 0o644)
    with caplog.at_level(logging.WARNING, logger="recsvc.ledger"):
        led = SQLiteLedger(path, 1.0)
    try:
        led.charge("u", "r", b"d", 0.5, resp("answer"))
        warned = [r.getMessage() for r in caplog.records if "other users can read" in r.getMessage()]
        assert len(warned) == 1 and "0o644" in warned[0] and "chmod 600" in warned[0]
        assert [_mode(path.with_name(path.name + s)) for s in ("-wal", "-shm")] == [0o600, 0o600]
    finally:
        led.close()
    caplog.clear()
    os.chmod(path, 0o600)
    with caplog.at_level(logging.WARNING, logger="recsvc.ledger"):
        SQLiteLedger(path, 1.0).close()
    assert not [r for r in caplog.records if "other users can read" in r.getMessage()]
