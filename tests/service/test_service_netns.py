"""Replicas as separate hosts: each `recsvc serve` runs in its own network namespace, joined to
the database's host by a veth pair, so replicas and PostgreSQL talk over real (virtual) links
rather than loopback. Needs root and `ip netns` (skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.ledger.testing.cluster import Cluster, pg_bin, remove_cluster, start_cluster
from recsvc.service.client import Client
from recsvc.service.testing import REPO, candidates, free_port

HOSTS = 2
_TAG = os.getpid() % 10_000
_NET = 100 + os.getpid() % 100  # 10.<_NET>.<host>.0/30: distinct for concurrent test runs


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or pg_bin() is None:
        return False
    probe = f"rsprobe{_TAG}"
    if _ip("netns", "add", probe, check=False).returncode != 0:
        return False
    _ip("netns", "del", probe, check=False)
    return True


pytestmark = pytest.mark.skipif(not _netns_usable(), reason="needs root, `ip netns` and PostgreSQL's binaries")


@dataclass(frozen=True)
class Host:
    ns: str
    veth: str  # the database side of the link
    db_side: str  # address of the database's host on this link
    address: str  # the replica host's address


def _hosts() -> list[Host]:
    return [Host(f"rs{_TAG}h{i}", f"rv{_TAG}h{i}", f"10.{_NET}.{i}.1", f"10.{_NET}.{i}.2") for i in range(HOSTS)]


@contextmanager
def _network(hosts: list[Host]) -> Iterator[None]:
    """One namespace per replica host, a veth pair to this (the database's) namespace each."""
    try:
        for h in hosts:
            _ip("netns", "add", h.ns)
            _ip("link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
            _ip("addr", "add", f"{h.db_side}/30", "dev", h.veth)
            _ip("link", "set", h.veth, "up")
            for cmd in (
                ["addr", "add", f"{h.address}/30", "dev", "eth0"],
                ["link", "set", "eth0", "up"],
                ["link", "set", "lo", "up"],
            ):
                _ip("-n", h.ns, *cmd)
        yield
    finally:
        for h in hosts:
            _ip("link", "del", h.veth, check=False)  # removes its peer too
            _ip("netns", "del", h.ns, check=False)


@dataclass
class Fleet:
    hosts: list[Host]
    targets: list[str]
    cluster: Cluster
    url: str  # as this (the database's) host reaches it


@pytest.fixture(scope="module")
def fleet(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    d = tmp_path_factory.mktemp("netns")
    hosts = _hosts()
    with ExitStack() as stack:
        stack.enter_context(_network(hosts))
        cluster = start_cluster(
            listen=",".join(["127.0.0.1", *(h.db_side for h in hosts)]), trust=(f"10.{_NET}.0.0/16",)
        )
        stack.callback(remove_cluster, cluster)
        db = cluster.new_database().rsplit("/", 1)[1]
        key = d / "shared.key"
        init = ["ledger", "init", "--ledger", cluster.url(db), "--budget", "5", "--fingerprint-key", str(key)]
        assert recsvc_main(init) == 0
        targets = []
        for i, h in enumerate(hosts):
            port = free_port()
            url = f"postgresql://postgres@{h.db_side}:{cluster.port}/{db}"  # the database over this host's link
            log = stack.enter_context(open(d / f"host{i}.log", "w"))
            proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    h.ns,
                    sys.executable,
                    "-m",
                    "recsvc.app.cli",
                    "serve",
                    "--artifacts",
                    str(artifact),
                    "--ledger",
                    url,
                    "--budget",
                    "5",
                    "--fingerprint-key",
                    str(key),
                    "--host",
                    h.address,
                    "--port",
                    str(port),
                    "--ledger-pool",
                    "4",
                    "--ledger-connect-timeout",  # a partition ends a query after 2 s (5 s by default)
                    "2",
                    "--drain-delay",
                    "0",
                ],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            stack.callback(_stop, proc)
            targets.append(f"{h.address}:{port}")
        for t in targets:
            _wait_serving(t)
        yield Fleet(hosts, targets, cluster, cluster.url(db))


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _wait_serving(target: str, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with Client(target, retries=0, timeout=2) as c:
                if c.health() == "SERVING":
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"replica {target} did not report SERVING within {within_s}s")


def _select(target: str, user: str, rid: str, epsilon: float) -> str:
    with Client(target, retries=0, timeout=30) as c:
        try:
            c.select(user, candidates(10), mechanism="rnm", epsilon=epsilon, request_id=rid)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name


def _spent(url: str, user: str) -> tuple[int, int, int]:
    """(stored requests, their summed units, the budget row's units) straight from the database."""
    with psycopg.connect(url) as conn:
        total = conn.execute(
            "SELECT count(*), coalesce(sum(epsilon_units), 0) FROM recsvc_requests WHERE user_id=%s", (user,)
        ).fetchone()
        row = conn.execute("SELECT spent_units FROM recsvc_budgets WHERE user_id=%s", (user,)).fetchone()
    assert total is not None  # an aggregate always returns its row
    n, units = total
    return int(n), int(units), 0 if row is None else int(row[0])


def test_replicas_on_separate_hosts_share_one_budget(fleet: Fleet) -> None:
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda i: _select(fleet.targets[i % HOSTS], "netns", f"r{i}", 0.1), range(200)))
    assert codes.count("OK") == 50 and codes.count("RESOURCE_EXHAUSTED") == 150
    n, units, spent = _spent(fleet.url, "netns")
    assert (n, units, spent) == (50, 50 * 10**11, 50 * 10**11)


def test_a_partitioned_host_refuses_and_spends_nothing_while_the_other_serves(fleet: Fleet) -> None:
    cut, other = fleet.hosts[0], fleet.targets[1]
    _ip("link", "set", cut.veth, "down")  # host 0 loses its link (a client must now call it from inside)
    ids = [item for item, _ in candidates(2)]
    try:
        assert _select(other, "part", "p-other", 0.1) == "OK"
        inside = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                cut.ns,
                sys.executable,
                "-c",
                "import grpc, sys, time; from recsvc.service.client import Client\nt0 = time.monotonic()\n"
                f"c = Client('{fleet.targets[0]}', retries=0, timeout=20)\n"
                f"try:\n    c.select('part', [('{ids[0]}', 0.5), ('{ids[1]}', 0.4)], mechanism='rnm', epsilon=0.1, "
                "request_id='p-cut')\n"
                "    print('OK')\nexcept grpc.RpcError as e:\n    print(e.code().name)\nprint(f'{time.monotonic() - t0:.1f}s', file=sys.stderr)\n"
                # the probe runs every second: polled until it has seen the outage (or 30 s have passed)
                "end = time.monotonic() + 30\n"
                "while (status := c.health()) != 'NOT_SERVING' and time.monotonic() < end:\n    time.sleep(0.2)\n"
                "print(status)",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert inside.stdout.split() == ["UNAVAILABLE", "NOT_SERVING"], inside.stderr
    finally:
        _ip("link", "set", cut.veth, "up")
    assert _spent(fleet.url, "part") == (1, 10**11, 10**11)  # only the other host's request
    _wait_serving(fleet.targets[0])
    assert _select(fleet.targets[0], "part", "p-back", 0.1) == "OK"
