"""Real `recsvc serve` processes on loopback: start-up, SIGTERM drain, kill -9 crash, multi-worker concurrency, CLI."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

import grpc
import psutil
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.service.client import Client
from recsvc.service.testing import REPO, candidates, free_port, run_recsvc, serve_argv, server_process
from recsvc.v1 import selection_pb2 as pb

Survivors = Callable[[list[psutil.Process], float], list[psutil.Process]]  # the conftest fixture


class _BatchOutcome(TypedDict, total=False):
    """What the in-flight SelectBatch call left: its results or its status, and when it ended."""

    results: list[pb.SelectResult]
    error: grpc.StatusCode
    done: float


def test_sigterm_drains_in_flight_calls_and_exits_zero(artifact: Path, tmp_path: Path) -> None:
    with server_process(
        artifact, tmp_path / "l.db", "--budget", "1000", "--drain-delay", "0.5", "--grace", "20"
    ) as srv:
        c = Client(srv.target, retries=0, timeout=60)
        reqs = [
            c.select_request(f"u{i % 7}", candidates(30, seed=i), mechanism="mgem", epsilon=0.5) for i in range(1000)
        ]
        outcome: _BatchOutcome = {}

        def run_batch() -> None:
            try:
                outcome["results"] = c.select_batch(reqs)
            except grpc.RpcError as exc:  # pragma: no cover - reported by the assertions below
                outcome["error"] = exc.code()
            outcome["done"] = time.monotonic()

        t = threading.Thread(target=run_batch)
        t.start()
        time.sleep(0.05)  # the batch (1000 durable commits) is in flight, or arrives during the drain delay
        sigterm_at = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        statuses = set()
        with Client(srv.target, retries=0, timeout=2) as probe:
            while srv.proc.poll() is None and time.monotonic() - sigterm_at < 20:
                try:
                    statuses.add(probe.health())
                except grpc.RpcError:
                    statuses.add("unreachable")
                time.sleep(0.05)
        t.join(60)
        assert srv.proc.wait(30) == 0
        assert "NOT_SERVING" in statuses
        assert "error" not in outcome and outcome["done"] > sigterm_at  # it WAS in flight at SIGTERM
        results = outcome["results"]
        assert len(results) == 1000 and all(r.WhichOneof("outcome") == "response" for r in results)
        c.close()
    led = SQLiteLedger(tmp_path / "l.db", budget=1000)
    assert sum(led.totals().values()) == pytest.approx(500.0)  # every answer was charged, exactly once


def _hammer(target: str, user: str, stop: threading.Event, sent: list[float], got: list[float]) -> None:
    with Client(target, retries=0, timeout=5) as c:
        while not stop.is_set():
            sent.append(0.01)
            try:
                r = c.select(user, candidates(20), mechanism="rnm", epsilon=0.01, request_id=uuid.uuid4().hex)
            except grpc.RpcError:
                return  # the server died: stop sending
            got.append(r.epsilon_spent)


def test_kill_9_never_undercounts(artifact: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    users = [f"crash-{k}" for k in range(4)]
    sent: dict[str, list[float]] = {u: [] for u in users}
    got: dict[str, list[float]] = {u: [] for u in users}
    port = free_port()
    with server_process(artifact, ledger, "--budget", "1000", port=port) as srv:
        stop = threading.Event()
        threads = [threading.Thread(target=_hammer, args=(srv.target, u, stop, sent[u], got[u])) for u in users]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60  # polled, not slept for: each user has had answers, and more are in flight
        while not all(len(got[u]) > 5 for u in users) and time.monotonic() < deadline:
            time.sleep(0.01)
        srv.proc.send_signal(signal.SIGKILL)  # mid-load, no drain
        srv.proc.wait(10)
        stop.set()
        for t in threads:
            t.join(10)
    assert all(len(got[u]) > 5 for u in users)  # the load really ran
    with server_process(artifact, ledger, "--budget", "1000", port=port) as srv:  # restart on the same ledger
        with Client(srv.target) as c:
            for u in users:
                spent = c.budget(u).spent
                assert sum(got[u]) - 1e-9 <= spent <= sum(sent[u]) + 1e-9, (u, sum(got[u]), spent, sum(sent[u]))
            c.select(users[0], candidates(), mechanism="rnm", epsilon=0.5)  # and it still serves


def test_a_killed_server_leaves_no_process_behind(artifact: Path, tmp_path: Path, survivors: Survivors) -> None:
    """kill -9 of `recsvc serve` after a heavy draw: its draw process (spawned at nice 19, waiting
    for work) and multiprocessing's resource tracker end too, though nothing told them to (the
    workers of --workers: test_service_startup.py)."""
    with server_process(artifact, tmp_path / "l.db", "--heavy-draws", "1000") as srv:
        with Client(srv.target, retries=0, timeout=60) as c:  # ≈ 1/γ = 10⁴ draws > --heavy-draws
            c.select("orphan", candidates(), mechanism="rs", epsilon=0.5, gamma=1e-4)
        descendants = psutil.Process(srv.proc.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in descendants]
        assert any("spawn_main" in c for c in commands) and any("resource_tracker" in c for c in commands)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)
        left = survivors(descendants, 20)  # seconds
        assert not left, [" ".join(p.cmdline()) for p in left]


def test_two_workers_share_port_and_ledger_exactly(artifact: Path, tmp_path: Path) -> None:
    """200 parallel requests for one user against a budget that allows 50: exactly 50 succeed."""
    port, metrics_port = free_port(), free_port()
    with server_process(
        artifact, tmp_path / "l.db", "--budget", "5", "--workers", "2", "--metrics-port", str(metrics_port), port=port
    ) as srv:
        workers = psutil.Process(srv.proc.pid).children()
        assert len(workers) == 2
        clients = [Client(srv.target, retries=0, timeout=30) for _ in range(16)]  # 16 connections

        def one(i: int) -> str:
            try:
                clients[i % 16].select("hot-user", candidates(), mechanism="rnm", epsilon=0.1)
                return "OK"
            except grpc.RpcError as exc:
                return exc.code().name

        with ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(one, range(200)))
        assert codes.count("OK") == 50 and codes.count("RESOURCE_EXHAUSTED") == 150
        assert clients[0].budget("hot-user").spent == pytest.approx(5.0)
        # The parent serves the workers' aggregated metrics (Prometheus multiprocess mode).
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        counts = {
            status: sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("recsvc_requests_total{")
                and 'method="Select"' in line
                and f'status="{status}"' in line
            )
            for status in ("OK", "RESOURCE_EXHAUSTED")
        }
        assert counts == {"OK": 50, "RESOURCE_EXHAUSTED": 150}
        for c in clients:
            c.close()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recsvc.app.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """The command's main in this process (the same parser and client as ``_cli``, without a
    process start per call), as a CompletedProcess."""
    capsys.readouterr()
    code = recsvc_main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_cli_select_budget_and_server_logs(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first call is a process of its own; the rest run the command's main here."""
    csv_path = tmp_path / "cands.csv"
    csv_path.write_text("item_id,score\nit1,0.5918273645\nit2,0.2\nit3,0.9\n")
    with server_process(artifact, tmp_path / "l.db", "--budget", "2") as srv:
        out = _cli(
            "-v",
            "select",
            "--target",
            srv.target,
            "--user",
            "cli-user",
            "--candidates",
            str(csv_path),
            "--mechanism",
            "mgem",
            "--epsilon",
            "0.5",
            "--request-id",
            "cli-1",
        )
        assert out.returncode == 0, out.stderr
        ans = json.loads(out.stdout)
        assert ans["item_id"] in {"it1", "it2", "it3"} and ans["mechanism"] == "mgem" and ans["request_id"] == "cli-1"
        assert ans["budget_remaining"] == pytest.approx(1.5)
        out = _main(
            capsys,
            "select",
            "--target",
            srv.target,
            "--user",
            "cli-user",
            "--candidates",
            str(csv_path),
            "--mechanism",
            "rnm",
            "--epsilon",
            "0.5",
            "--k",
            "2",
        )
        assert out.returncode == 0, out.stderr
        ans = json.loads(out.stdout)  # a slate: 2 distinct items, item_id first, ε charged once
        assert len(set(ans["item_ids"])) == 2 and set(ans["item_ids"]) <= {"it1", "it2", "it3"}
        assert ans["item_id"] == ans["item_ids"][0] and ans["budget_remaining"] == pytest.approx(1.0)
        out = _main(
            capsys,
            "select",
            "--target",
            srv.target,
            "--user",
            "cli-user",
            "--candidates",
            str(csv_path),
            "--epsilon",
            "0.5",
            "--k",
            "4",
        )
        assert out.returncode == 2 and "INVALID_ARGUMENT: k=4 is more than the 3 candidates" in out.stderr
        out = _main(
            capsys,
            "select",
            "--target",
            srv.target,
            "--user",
            "cli-user",
            "--candidate",
            "it4:0.4",
            "--candidate",
            "it5:nan",
            "--epsilon",
            "0.5",
        )
        assert out.returncode == 2 and "INVALID_ARGUMENT" in out.stderr and len(out.stderr.strip().splitlines()) == 1
        out = _main(
            capsys, "select", "--target", srv.target, "--user", "cli-user", "--candidate", "it4:0.4", "--epsilon", "5"
        )
        assert out.returncode == 2 and "RESOURCE_EXHAUSTED" in out.stderr
        out = _main(capsys, "budget", "--target", srv.target, "--user", "cli-user")
        assert out.returncode == 0 and json.loads(out.stdout)["spent"] == pytest.approx(1.0)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        assert "serving recsvc.v1.PrivateSelection" in srv.log() and "5918273645" not in srv.log()
    bad = _main(capsys, "serve", "--artifacts", str(tmp_path / "missing"), "--port", "0")
    assert bad.returncode == 2 and "does not exist" in bad.stderr


# `recsvc serve`'s parser and start(), the kernels' warm-up (which runs after listening) left out.
_LISTEN_ONLY = """
import sys
import recsvc.service.selection as selection
from recsvc.app.cli import build_parser
from recsvc.service.config import ServerConfig
from recsvc.service.server import start

build_parser()
selection.warm_kernels = lambda: None
start(ServerConfig.of(sys.argv[1], port=0, ledger=sys.argv[2])).stop(0)
print(sorted(m for m in ("scipy.optimize", "scipy.special") if m in sys.modules))
"""


def test_the_server_listens_without_the_imports_only_some_calls_need(artifact: Path, tmp_path: Path) -> None:
    """scipy.optimize (multi-selection's offsets) and scipy.special (exact probabilities, clm's class
    sizes) take ≈ 0.8 s to import: the parser and start() leave them to the first call that needs them."""
    args = [sys.executable, "-c", _LISTEN_ONLY, str(artifact), str(tmp_path / "l.db")]
    assert subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_wait_ready_and_the_ready_file_follow_the_servers_start_and_stop(
    artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`recsvc wait-ready`, started with the server (a process of its own), returns 0 once it
    answers SERVING; the --ready-file, written once it listens, names a port that accepts, and is
    gone after SIGTERM. On a port nothing listens on, wait-ready (its main, here) gives up after
    --timeout: one line, exit 2."""
    port, ready = free_port(), tmp_path / "ready"
    argv = serve_argv(artifact, tmp_path / "l.db", port, "--ready-file", str(ready))
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        waited = run_recsvc("wait-ready", "--target", f"127.0.0.1:{port}", "--timeout", "120", timeout=150)
        assert waited.returncode == 0 and waited.stderr == "", waited.stderr
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:  # it follows health SERVING closely
            time.sleep(0.05)
        assert ready.read_text() == f"127.0.0.1:{port}\n"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0 and not ready.exists()
    finally:
        proc.kill()
        proc.wait(10)
    nobody = _main(capsys, "wait-ready", "--target", f"127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert nobody.returncode == 2
    assert re.fullmatch(
        r"recsvc wait-ready: error: --target 127\.0\.0\.1:\d+ did not answer health SERVING within 0\.5s "
        r"\(last: UNAVAILABLE\); expected a running `recsvc serve` there\n",
        nobody.stderr,
    ), nobody.stderr
