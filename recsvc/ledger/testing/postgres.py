"""Helpers for tests that drive the PostgreSQL store's rounds from several threads and replicas:
open replicas of one database, wait for queued items, count round statements."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from recsvc.ledger import LedgerObserver
from recsvc.ledger.postgres import PostgresLedger
from recsvc.ledger.postgres.connection import Connection
from recsvc.ledger.testing import Stores
from recsvc.ledger.testing.cluster import Cluster


def replicas(
    pg_cluster: Cluster, tmp_path: Path, budget: float = 1.0, observer: LedgerObserver | None = None
) -> tuple[Stores, PostgresLedger, PostgresLedger]:
    s = Stores(pg_cluster.new_database(), tmp_path / "k")
    return s, open_replica(s, budget=budget, observer=observer), open_replica(s, budget=budget)


def open_replica(s: Stores, **settings: Any) -> PostgresLedger:
    """A replica of the PostgreSQL ledger ``s`` names."""
    return cast(PostgresLedger, s.open(**settings))


def until(done: Callable[[], bool], seconds: float = 10.0) -> None:
    """Waits for other threads to reach a point (``done()``), at most ``seconds``; the caller's
    asserts then say what did not happen."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.002)


def queued_for(a: PostgresLedger, n: int) -> Callable[[], bool]:
    """Whether ``n`` items have queued for ``a``'s next round."""
    return lambda: a._group_commit.queued() >= n


def lock_waiters(conn: Any) -> int:
    """How many server backends wait for a lock (``conn``: a psycopg connection to the cluster)."""
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
    assert row is not None
    return int(row[0])


def queue_in_order(a: PostgresLedger, threads: list[threading.Thread], queued: int = 0) -> None:
    """Starts ``threads`` one by one, each once the one before has queued for ``a``'s next round
    (which holds ``queued`` items before them), so they queue, and lead, in that order."""
    for n, thread in enumerate(threads, start=queued + 1):
        thread.start()
        until(queued_for(a, n))


def count_rounds(a: PostgresLedger, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (charges, pre-checks) of each round statement ``a`` runs from now on."""
    rounds: list[tuple[int, int]] = []
    unchanged = a._charge_unchanged

    def counted(conn: Connection, charges: list[Any], probes: list[Any]) -> Any:
        rounds.append((len(charges), len(probes)))
        return unchanged(conn, charges, probes)

    monkeypatch.setattr(a, "_charge_unchanged", counted)
    return rounds
