"""Several `recsvc serve` processes sharing one PostgreSQL ledger: the budget holds across
replicas, a replica killed mid-burst and a database crash mid-burst leave every received
answer charged and the ledger consistent."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.ledger.units import charge_units
from recsvc.service.client import Client
from recsvc.service.testing import ServerProcess, candidates, server_process
from recsvc.v1 import selection_pb2 as pb

CANDS = candidates(10)


@dataclass
class Fleet:
    url: str
    replicas: list[ServerProcess]
    key: Path


@pytest.fixture(scope="module")
def fleet(pg_cluster, artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    d = tmp_path_factory.mktemp("replicas")
    url, key = pg_cluster.new_database(), d / "shared.key"
    assert recsvc_main(["ledger", "init", "--ledger", url, "--budget", "5", "--fingerprint-key", str(key)]) == 0
    # --ledger-connect-timeout 2: an outage's requests give up waiting for a pooled connection, and a
    # lost connection is retried, for 2 s (5 s by default), long enough for a loaded host's bursts.
    flags = (
        *("--budget", "5", "--fingerprint-key", str(key), "--ledger-pool", "4", "--threads", "16"),
        *("--ledger-connect-timeout", "2"),
    )
    with ExitStack() as stack:
        # The three start side by side (each enters the stack once it listens, so every one that
        # started is stopped, whichever failed).
        with ThreadPoolExecutor(3) as starting:
            replicas = list(
                starting.map(
                    stack.enter_context,
                    [server_process(artifact, url, *flags, log_path=d / f"replica{i}.log") for i in range(3)],
                )
            )
        yield Fleet(url, replicas, key)


def _select(target: str, user: str, rid: str, epsilon: float) -> tuple[str, pb.SelectResponse | None]:
    """(status name, response or None) of one Select, without client retries."""
    with Client(target, retries=0, timeout=30) as c:
        try:
            return "OK", c.select(user, CANDS, mechanism="rnm", epsilon=epsilon, request_id=rid)
        except grpc.RpcError as exc:
            return exc.code().name, None


def _health_becomes(target: str, status: str, within_s: float = 15.0) -> bool:
    """Whether the replica's health check reports ``status`` within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    with Client(target, retries=0, timeout=5) as c:
        while time.monotonic() < deadline:
            if c.health() == status:
                return True
            time.sleep(0.2)
    return False


def _ledger_rows(url: str, user: str) -> tuple[dict[str, tuple[Any, ...]], int, int]:
    """(request_id → stored answer (item_ids, mechanism, epsilon_spent, budget_remaining), spent
    units, request count) straight from the database."""
    with psycopg.connect(url) as conn:
        sql = (
            "SELECT request_id, item_ids, mechanism, epsilon_spent, budget_remaining FROM recsvc_requests "
            "WHERE user_id=%s"
        )
        stored = {r: (json.loads(ids), *rest) for r, ids, *rest in conn.execute(sql, (user,))}
        total = conn.execute(
            "SELECT coalesce(sum(epsilon_units), 0) FROM recsvc_requests WHERE user_id=%s", (user,)
        ).fetchone()
        row = conn.execute("SELECT spent_units, requests FROM recsvc_budgets WHERE user_id=%s", (user,)).fetchone()
    assert total is not None  # an aggregate always returns its row
    units = total[0]
    spent, n = (0, 0) if row is None else (int(row[0]), int(row[1]))
    assert (spent, n) == (int(units), len(stored))  # consistent: the budget row is the sum of the charges
    return stored, spent, n


def _assert_received_are_charged(url: str, user: str, received: dict[str, pb.SelectResponse]) -> None:
    stored, _, _ = _ledger_rows(url, user)
    for rid, resp in received.items():
        assert rid in stored, rid
        answer = (list(resp.item_ids), resp.mechanism, resp.epsilon_spent, resp.budget_remaining)
        assert answer == stored[rid]  # the very answer the client got


def test_200_requests_over_3_replicas_against_a_budget_for_50(fleet: Fleet) -> None:
    targets = [r.target for r in fleet.replicas]
    with ThreadPoolExecutor(24) as pool:
        out = list(pool.map(lambda i: _select(targets[i % 3], "burst", f"r{i}", 0.1), range(200)))
    codes = [c for c, _ in out]
    assert (codes.count("OK"), codes.count("RESOURCE_EXHAUSTED")) == (50, 150)
    _, spent, n = _ledger_rows(fleet.url, "burst")
    assert (spent, n) == (5 * 10**12, 50)
    for t in targets:  # every replica reads the same account
        with Client(t) as c:
            b = c.budget("burst")
        assert (b.spent, b.remaining, b.requests) == (5.0, 0.0, 50)


def test_kill_9_of_a_replica_mid_burst(fleet: Fleet) -> None:
    victim, survivor = fleet.replicas[2], fleet.replicas[0]
    received: dict[str, pb.SelectResponse] = {}
    lock = threading.Lock()
    done = threading.Event()

    def one(i: int) -> str:
        target = victim.target if i % 2 else survivor.target
        code, resp = _select(target, "kill", f"k{i}", 0.01)
        if code == "OK":
            assert resp is not None
            with lock:
                received[f"k{i}"] = resp
                if len(received) >= 30:
                    done.set()
        return code

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, i) for i in range(160)]
        assert done.wait(60)
        victim.proc.send_signal(signal.SIGKILL)
        codes = [f.result() for f in futures]
    assert victim.proc.wait(10) == -signal.SIGKILL
    assert codes.count("OK") == len(received) and codes.count("UNAVAILABLE") > 0  # the victim's later calls
    assert all(codes[i] == "OK" for i in range(0, 160, 2))  # the survivor answered all of its share
    _assert_received_are_charged(fleet.url, "kill", received)
    _, spent, n = _ledger_rows(fleet.url, "kill")
    assert n >= len(received) and spent == n * charge_units(0.01)


def test_database_crash_and_restart_mid_burst(fleet: Fleet, pg_cluster) -> None:
    targets = [r.target for r in fleet.replicas[:2]]
    received: dict[str, pb.SelectResponse] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def stream(worker: int) -> list[str]:
        codes, i = [], 0
        while not stop.is_set():
            rid = f"s{worker}-{i}"
            code, resp = _select(targets[worker % 2], "crash", rid, 0.001)
            codes.append(code)
            if code == "OK":
                assert resp is not None
                with lock:
                    received[rid] = resp
            i += 1
        return codes

    def answered_more(than: int, within: float = 60.0) -> None:
        """Polls until the streams have had 5 more answers than ``than`` (a sleep would assume a rate)."""
        deadline = time.monotonic() + within
        while len(received) < than + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(received) >= than + 5, f"the burst got {len(received) - than} answers in {within:g}s"

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(stream, w) for w in range(4)]
        try:
            answered_more(0)
            pg_cluster.stop("immediate")  # mid-burst
            try:
                # During the outage every request fails with UNAVAILABLE (and cannot be stored).
                with ThreadPoolExecutor(6) as outage:
                    during = list(outage.map(lambda i: _select(targets[i % 2], "outage", f"o{i}", 0.001), range(6)))
                assert [c for c, _ in during] == ["UNAVAILABLE"] * 6
                # A load balancer sees it: both replicas report NOT_SERVING while the database is down.
                assert [_health_becomes(t, "NOT_SERVING") for t in targets] == [True, True]
            finally:
                pg_cluster.start()
            assert [_health_becomes(t, "SERVING") for t in targets] == [True, True]
            deadline = time.monotonic() + 40
            for t in targets:  # each replica's pool reconnects (with its backoff)
                while time.monotonic() < deadline and _select(t, "after", f"a{time.monotonic_ns()}", 0.001)[0] != "OK":
                    time.sleep(0.2)
            answered_more(len(received))  # the burst is answered again
        finally:
            stop.set()  # also when a step fails: leaving the pool waits for the streams
        codes = [c for f in futures for c in f.result()]
    assert set(codes) <= {"OK", "UNAVAILABLE"} and codes.count("UNAVAILABLE") > 0 and codes.count("OK") > 0
    _assert_received_are_charged(fleet.url, "crash", received)
    assert _ledger_rows(fleet.url, "outage") == ({}, 0, 0)  # the outage's requests spent nothing
    after = [_select(t, "after2", f"b{i}", 0.001)[0] for i, t in enumerate(targets * 3)]
    assert after == ["OK"] * 6  # both replicas serve again: their pools reconnected
    assert os.path.isdir(pg_cluster.data)
