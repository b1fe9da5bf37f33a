"""No client can pin the server: regression tests through a real `recsvc serve` process.

Each server runs with small bounds (4 request threads, 4 health watchers, a 1 s receive
timeout), so that the attacks below, scaled to those bounds, would have stopped the earlier
thread-per-call server outright: 4 Watch streams or 4 header-only calls held all its threads.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1.health_pb2 import HealthCheckResponse

from recsvc.service.client import Client
from recsvc.service.testing import (
    RawStreams,
    ServerProcess,
    candidates,
    grpc_frame,
    heavy_attack,
    rpc_error,
    select_request,
    server_process,
)
from recsvc.v1 import selection_pb2 as pb

SELECT = "/recsvc.v1.PrivateSelection/Select"
WATCH = "/grpc.health.v1.Health/Watch"
SMALL = ("--threads", "4", "--max-health-watches", "4", "--receive-timeout", "1")
ATTACKERS = 64


def _tokens(path: Path) -> Path:
    lines = ["innocent service", "slow service", "admin admin"] + [f"atk{i} user:atk{i}" for i in range(ATTACKERS)]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


@contextmanager
def _attacked(artifact: Path, tmp: Path, *extra: str) -> Iterator[ServerProcess]:
    """A server with the SMALL bounds and ``extra`` flags. Its ledger is on tmpfs where there is
    one: the latency bounds are about what attackers do to an innocent caller, not about the host
    disk's fsync (on a shared test host, other processes' writes alone make it spike past 50 ms)."""
    shm = Path("/dev/shm")
    ledger_dir = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp
    try:
        flags = (*SMALL, "--token-file", str(_tokens(tmp / "tokens")), *extra)
        with server_process(artifact, ledger_dir / "l.db", *flags, log_path=tmp / "serve.log") as srv:
            yield srv
    finally:
        if ledger_dir != tmp:
            shutil.rmtree(ledger_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def attacked(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the attacks below: a 1 MiB byte budget and a heavy queue of 4, 1 per principal."""
    budget = ("--max-message-bytes", "1048576", "--max-inflight-bytes", "1048576")
    with _attacked(
        artifact, tmp_path_factory.mktemp("attacked"), *budget, "--heavy-queue", "4", "--heavy-per-principal", "1"
    ) as srv:
        yield srv


def _auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _latencies(client: Client, n: int, gap: float = 0.005) -> list[float]:
    """``n`` Selects one at a time; each call's latency in seconds (any error fails the test)."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        client.select("innocent-user", candidates(seed=i % 7), mechanism="rnm", epsilon=0.01)
        out.append(time.perf_counter() - t0)
        time.sleep(gap)
    return out


def test_idle_watches_header_only_and_slow_body_streams_pin_nothing(attacked: ServerProcess) -> None:
    """16 anonymous Watch streams, 200 header-only Selects over 4 raw connections and 32 slow
    bodies (with a valid token), all open at once: an authenticated caller's Select p99 stays
    under 50 ms with no errors, and the server's memory grows by less than 200 MB. The header-only
    calls are refused on their metadata at once; the slow bodies are cut off by the receive timeout."""
    server = psutil.Process(attacked.proc.pid)
    with Client(attacked.target, token="innocent", retries=0, timeout=5) as innocent:
        _latencies(innocent, 20)  # warm: connection, caches
        rss0 = server.memory_info().rss
        channel = grpc.insecure_channel(attacked.target, options=[("grpc.use_local_subchannel_pool", 1)])
        watch = channel.unary_stream(WATCH)
        watches = [watch(b"", timeout=30) for _ in range(16)]  # an empty HealthCheckRequest: the server's health
        raw = [RawStreams(attacked.port) for _ in range(4)]
        header_only = [{r.open(SELECT) for _ in range(50)} for r in raw]
        slow = RawStreams(attacked.port)
        body = grpc_frame(select_request("slow-user", "slow-1").SerializeToString())
        slow_ids = {slow.open(SELECT, _auth("slow")) for _ in range(32)}
        for sid in slow_ids:  # a valid credential, then 3 bytes of the message: never the rest
            slow.send(sid, body[:3])
        t0 = time.monotonic()
        latencies = _latencies(innocent, 50)
        early = slow.closed(max(0.05, t0 + 0.7 - time.monotonic()))  # before the receive timeout (1 s)...
        early_read = time.monotonic() - t0
        latencies += _latencies(innocent, 100)
        rss1 = server.memory_info().rss
        ended = [r.closed(0.3) for r in raw]
        late = slow.closed(max(0.1, t0 + 1.6 - time.monotonic()))  # the receive timeout (1 s) has passed
        watched = [_first(w) for w in watches]
        for w in watches:
            w.cancel()
        channel.close()
        for r in [*raw, slow]:
            r.close()
    p99 = float(np.percentile(latencies, 99))
    assert p99 < 0.050, f"innocent p99 {p99 * 1e3:.1f} ms under attack"
    assert rss1 - rss0 < 200 << 20
    assert all(ids <= e for ids, e in zip(header_only, ended, strict=True))  # every one answered
    assert early_read > 0.95 or not early & slow_ids  # ...no slow body was cut off (unless this host lagged)
    assert slow_ids <= late  # ...and every one after it
    # Watch: 4 (--max-health-watches) are served; the rest are refused, not queued.
    served = [HealthCheckResponse.FromString(w).status for w in watched if isinstance(w, bytes)]
    refused = [w for w in watched if not isinstance(w, bytes)]
    assert served == [HealthCheckResponse.SERVING] * 4 and len(refused) == 12
    assert all(code is grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-health-watches" in m for code, m in refused)


def test_a_call_without_its_message_is_refused_or_timed_out(attacked: ServerProcess) -> None:
    """A call whose message never comes (a gRPC client's request stream that never yields):
    anonymous, it is refused UNAUTHENTICATED on its metadata; authenticated, it gets
    DEADLINE_EXCEEDED after --receive-timeout (1 s), not the client's own 30 s deadline."""
    never = threading.Event()

    def nothing() -> Iterator[bytes]:
        never.wait(30)
        yield from ()

    with grpc.insecure_channel(attacked.target) as channel:
        call = channel.stream_unary(SELECT)
        t0 = time.monotonic()
        assert rpc_error(call, nothing(), timeout=30)[0] is grpc.StatusCode.UNAUTHENTICATED
        assert time.monotonic() - t0 < 0.9
        code, message = rpc_error(call, nothing(), metadata=_auth("slow"), timeout=30)
        waited = time.monotonic() - t0
    never.set()
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED and "(--receive-timeout)" in message
    assert 0.9 < waited < 5


def _first(stream: Any) -> bytes | tuple[grpc.StatusCode, str]:
    """A Watch stream's first message, or the status that ended it."""
    try:
        return bytes(next(stream))
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


@pytest.fixture(scope="module")
def bounded(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with 3 RPC slots, --heavy-draws 49 and two-stage Recommends of 2 <= m <= 10."""
    flags = (
        "--max-concurrent-rpcs",
        "3",
        "--heavy-draws",
        "49",
        "--min-candidates",
        "2",
        "--max-num-candidates",
        "10",
    )
    with _attacked(artifact, tmp_path_factory.mktemp("bounded"), *flags) as srv:
        yield srv


def test_calls_beyond_the_concurrency_bound_are_refused_and_spend_nothing(bounded: ServerProcess) -> None:
    """3 authenticated calls whose bodies never come hold the 3 slots: a 4th call is refused
    RESOURCE_EXHAUSTED at once and spends nothing; once the receive timeout frees the slots,
    the same request is answered."""
    slow = RawStreams(bounded.port)
    for _ in range(3):
        slow.open(SELECT, _auth("slow"))
    time.sleep(0.2)
    with Client(bounded.target, token="innocent", retries=0, timeout=5) as c:
        code, message = rpc_error(c.select, "bound-user", candidates(), mechanism="rnm", epsilon=0.5, request_id="r1")
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-concurrent-rpcs" in message
        time.sleep(1.2)
        assert c.budget("bound-user").spent == 0.0
        r = c.select("bound-user", candidates(), mechanism="rnm", epsilon=0.5, request_id="r1")
        assert not r.replayed and c.budget("bound-user").spent == pytest.approx(0.5)
    slow.close()


def test_the_candidate_stage_is_counted_and_capped(bounded: ServerProcess) -> None:
    """A two-stage Recommend's private top-m is one run of a one-shot mechanism over the catalog
    (40 draws), then rnm over the m: with m = 9 its work is 40 + 9 = 49 draws, drawn inline; with
    m = 10, 40 + 10 = 50 > --heavy-draws 49, so it is deferred and drawn by a draw process (which
    the server spawns on its first heavy draw). m = 11 is over --max-num-candidates: INVALID_ARGUMENT, nothing spent."""
    server = psutil.Process(bounded.proc.pid)

    def drawers() -> int:
        return sum("spawn_main" in " ".join(c.cmdline()) for c in server.children())

    history = ["it1", "it2", "it3"]
    with Client(bounded.target, token="innocent", retries=0, timeout=30) as c:
        c.recommend("stage-user", history, mechanism="rnm", epsilon=1.0, num_candidates=9, candidate_fraction=0.5)
        assert drawers() == 0
        r = c.recommend("stage-user", history, mechanism="rnm", epsilon=1.0, num_candidates=10, candidate_fraction=0.5)
        assert r.item_id and drawers() == 1
        code, message = rpc_error(
            c.recommend, "stage-user", history, mechanism="rnm", epsilon=1.0, num_candidates=11, candidate_fraction=0.5
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith("num_candidates=11 is more than this server's cap of 10 (--max-num-candidates)")
        assert c.budget("stage-user").requests == 2


def test_request_bytes_in_flight_are_bounded(attacked: ServerProcess) -> None:
    """Two 600 kB requests against a 1 MiB byte budget: while the first is being served, the
    second is refused RESOURCE_EXHAUSTED before it is decoded, and spends nothing."""
    pad = b"\xfa\x06" + _varint(600_000) + bytes(600_000)  # field 111 (unknown): kept aside by the parser
    first = select_request("bytes-a", "a").SerializeToString() + pad
    req = pb.SelectRequest.FromString(select_request("bytes-b", "b").SerializeToString())
    req.mechanism, req.gamma, req.k = "rs", 1e-6, 10  # ≈ 10⁷ draws: heavy (and the first spawns the draw process)
    heavy = req.SerializeToString() + pad
    channel = grpc.insecure_channel(attacked.target)
    select = channel.unary_unary(SELECT)
    held = select.future(heavy, metadata=_auth("innocent"), timeout=60)
    time.sleep(0.15)
    code, message = rpc_error(select, first, metadata=_auth("innocent"), timeout=10)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-inflight-bytes" in message
    assert not held.done()  # refused while the heavy one held its bytes
    assert pb.SelectResponse.FromString(held.result()).epsilon_spent == pytest.approx(0.5)
    assert pb.SelectResponse.FromString(select(first, metadata=_auth("innocent"), timeout=10)).item_id
    with Client(attacked.target, token="admin", retries=0) as c:
        assert c.budget("bytes-a").requests == 1  # the refused attempt spent nothing
        assert c.budget("bytes-b").requests == 1
    channel.close()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_heavy_attackers_never_delay_an_innocent_caller(attacked: ServerProcess) -> None:
    """64 callers, each with its own `user:` token, send rs at γ = 1e-6 with k = 5 (≈ 5·10⁶
    draws each; scripts/bench/attack.py runs the issue's k = 20) back to back from another
    process, for 2.5 s. The innocent caller's p99 stays
    under 50 ms with no errors; the heavy queue refuses the excess RESOURCE_EXHAUSTED, and a
    refused call spends nothing: each attacker's spent ε is exactly its answered calls' ε."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    tokens = [f"atk{i}" for i in range(ATTACKERS)]
    with Client(attacked.target, token="innocent", retries=0, timeout=5) as innocent:
        _latencies(innocent, 10)
        attackers = ctx.Process(
            target=heavy_attack, args=(attacked.target, tokens, 2.5, 0.02, 5, candidates(), results)
        )
        attackers.start()
        time.sleep(1.5)  # the spawned process imports, connects and fills the queue
        latencies = _latencies(innocent, 100)
        outcomes = results.get(timeout=60)
        attackers.join(10)
    p99 = float(np.percentile(latencies, 99))
    assert p99 < 0.050, f"innocent p99 {p99 * 1e3:.1f} ms under {ATTACKERS} heavy attackers"
    total = sum((Counter(c) for c in outcomes.values()), Counter())
    assert set(total) == {"OK", "RESOURCE_EXHAUSTED"}, total
    with Client(attacked.target, token="admin", retries=0) as admin:
        for token in tokens:
            u = admin.budget(token)
            ok = outcomes[token].get("OK", 0)
            assert u.requests == ok and u.spent == pytest.approx(ok * 1e-3)


def test_a_call_is_alone_only_with_nothing_else_in_flight() -> None:
    """The gate's test for running a call on the event loop (decision 0005): an inline method, a
    message of at most INLINE_BYTES, the only admitted call, no request thread or heavy call busy."""
    from recsvc.service.admission import Admission
    from recsvc.service.auth import Authenticator
    from recsvc.service.config import Admission as AdmissionSettings
    from recsvc.service.draws import HeavyCalls
    from recsvc.service.interceptors import INLINE_BYTES, Gate
    from recsvc.service.threads import Threads

    pool, heavy = Threads(1, "alone-test"), HeavyCalls(2, 1)
    gate = Gate(Authenticator(), admission=Admission(AdmissionSettings()), pool=pool, heavy=heavy, inline=[SELECT])
    assert gate.admission.rpcs.take()  # the call itself
    assert gate.alone(SELECT, INLINE_BYTES)
    assert not gate.alone(SELECT, INLINE_BYTES + 1)
    assert not gate.alone("/recsvc.v1.PrivateSelection/SelectBatch", 100)
    for counter, attr in ((gate.admission.rpcs, "held"), (pool, "pending"), (heavy, "held")):
        setattr(counter, attr, getattr(counter, attr) + 1)  # another call, request thread or heavy call
        assert not gate.alone(SELECT, 100), attr
        setattr(counter, attr, getattr(counter, attr) - 1)
    assert gate.alone(SELECT, 100)
    assert not Gate(Authenticator(), pool=pool, heavy=heavy).alone(SELECT, 100)  # no inline methods


@pytest.mark.parametrize(
    ("params", "inline"),
    [
        ({}, (SELECT,)),
        ({"workers": 2, "port": 50051}, ()),  # another process may hold the ledger file's lock
        ({"ledger": "postgresql://u@db.internal/recsvc"}, ()),  # every commit is a network round trip
    ],
)
def test_lone_calls_run_on_the_loop_only_with_a_ledger_of_this_process(params: dict[str, Any], inline: tuple) -> None:
    from recsvc.service.aioserver import inline_methods
    from recsvc.service.config import ServerConfig

    assert inline_methods(ServerConfig.of("art", **params)) == inline
