"""No principal can take the gate's pools from the others: one token holding idle reflection
streams, or header-only and slow-body Selects, gets its share of each pool (``--principal-share``
of ``--max-streaming-calls`` and of ``--max-concurrent-rpcs``), its calls beyond it are refused
RESOURCE_EXHAUSTED before their message is read and spend nothing, and every call of another
principal is answered. Through one in-process server with the default pools (16 streaming calls,
128 calls, a quarter each per principal) and short deadlines, so that the held streams end within
seconds. No test bounds a latency: innocent calls have a deadline of seconds (answered, not hung).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2
from prometheus_client import REGISTRY

from recsvc.service.admission import Full, Shares
from recsvc.service.auth import anonymous_key
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import ServerHandle
from recsvc.service.testing import (
    RawStreams,
    candidates,
    grpc_frame,
    once_admitted,
    rpc_error,
    select_request,
    served,
)

SELECT = "/recsvc.v1.PrivateSelection/Select"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
IDLE, RECEIVE = 2.0, 2.5  # --stream-idle-timeout, --receive-timeout (seconds): the held streams must outlast a
# burst of 128 opens and the innocent caller's calls on a loaded 2-core host
ANSWERED_WITHIN = 20.0  # an innocent call's deadline: "answered, not hung", never "fast"


@pytest.fixture(scope="module")
def fair(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    tmp = tmp_path_factory.mktemp("fair")
    tokens = tmp / "tokens"
    tokens.write_text("innocent service\nstreamer user:streamer\nslow user:slow\n")
    tokens.chmod(0o600)
    with served(artifact, tmp / "l.db", token_file=tokens, stream_idle_timeout=IDLE, receive_timeout=RECEIVE) as h:
        yield h


def _auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _statuses(method: str, *codes: str) -> list[float]:
    return [_count("recsvc_requests_total", method=method, mechanism="", status=c) for c in codes]


def _until_ended(streams: list[RawStreams], n: int, within: float = 30.0) -> None:
    """Reads until the server has ended ``n`` of the streams opened on ``streams``."""
    deadline = time.monotonic() + within
    while sum(len(s.closed(0.02)) for s in streams) < n:
        assert time.monotonic() < deadline, f"the server never ended {n} streams"


def _innocent(c: Client, n: int) -> None:
    """``n`` Selects and ``n`` GetBudgets of another principal: each must be answered (any error fails)."""
    before = c.budget("innocent-user").requests
    for i in range(n):
        assert c.select("innocent-user", candidates(seed=i % 7), mechanism="rnm", epsilon=0.01).item_id
        assert c.budget("innocent-user").requests == before + i + 1


def _reflect(target: str, token: str) -> list[str]:
    """The services a reflection call of ``token`` lists."""
    request = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(REFLECTION)
        answers = list(call(iter([request]), metadata=_auth(token), timeout=ANSWERED_WITHIN))
    listed = reflection_pb2.ServerReflectionResponse.FromString(answers[0]).list_services_response
    return [s.name for s in listed.service]


def test_one_token_holding_128_idle_reflection_streams_gets_its_share_and_no_more(
    fair: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """A `user:` token opens 128 reflection streams (two connections) and sends nothing: 4 of them
    (a quarter of --max-streaming-calls 16) are served and the other 124 refused at once; another
    principal's Selects, GetBudgets and reflection calls are all answered meanwhile; the 4 are
    ended DEADLINE_EXCEEDED by the idle deadline, none before it. The server counts each outcome,
    and logs at most 5 of the 124 refusals (the principal's throttle)."""
    target = f"127.0.0.1:{fair.port}"
    refused0 = _count("recsvc_gate_refusals_total", pool="--max-streaming-calls", limit="principal")
    ended0 = _statuses("ServerReflectionInfo", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
    with Client(target, token="innocent", retries=0, timeout=ANSWERED_WITHIN) as innocent:
        _innocent(innocent, 2)  # warm: connection, caches
        caplog.set_level(logging.WARNING, logger="recsvc.service")
        raw = [RawStreams(fair.port) for _ in range(2)]
        opened = time.monotonic()
        ids = [{r.open(REFLECTION, _auth("streamer")) for _ in range(64)} for r in raw]
        _until_ended(raw, 124)
        _innocent(innocent, 10)
        assert "recsvc.v1.PrivateSelection" in _reflect(target, "innocent")
        ended = [r.until_closed(i, 30.0) for r, i in zip(raw, ids, strict=True)]
        for r in raw:
            r.close()
    assert all(i <= e for i, e in zip(ids, ended, strict=True))  # every one ended
    lived = sorted(t - opened for r in raw for t in r.ended_at.values())
    assert min(lived[-4:]) >= IDLE - 0.01  # the 4 served lasted the idle deadline
    assert _count("recsvc_gate_refusals_total", pool="--max-streaming-calls", limit="principal") - refused0 == 124
    ended1 = _statuses("ServerReflectionInfo", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
    assert [b - a for a, b in zip(ended0, ended1, strict=True)] == [124, 4]
    logged = [r for r in caplog.records if "RESOURCE_EXHAUSTED ServerReflectionInfo" in r.getMessage()]
    assert len(logged) == 5 and all("user:streamer" in r.getMessage() for r in logged)


def test_one_token_holding_header_only_and_slow_body_selects_gets_its_share_and_spends_nothing(
    fair: ServerHandle,
) -> None:
    """A `user:` token opens 40 Selects and never sends their messages (20 header-only, 20 with 3
    bytes of one): 32 hold slots (a quarter of --max-concurrent-rpcs 128), 8 are refused at once.
    Its own complete Select is then refused RESOURCE_EXHAUSTED naming --principal-share and spends
    nothing, while another principal's Selects and GetBudgets are all answered. The receive
    timeout ends the 32; then the same Select is answered and charged once."""
    target = f"127.0.0.1:{fair.port}"
    timed_out0 = _statuses("Select", "DEADLINE_EXCEEDED")[0]
    body = grpc_frame(select_request("slow", "s-0").SerializeToString())
    with (
        Client(target, token="innocent", retries=0, timeout=ANSWERED_WITHIN) as innocent,
        Client(target, token="slow", retries=0, timeout=ANSWERED_WITHIN) as slow,
    ):
        assert slow.budget("slow").requests == 0  # warm its connection
        raw = RawStreams(fair.port)
        ids = {raw.open(SELECT, _auth("slow")) for _ in range(40)}
        for sid in sorted(ids)[:20]:
            raw.send(sid, body[:3])
        _until_ended([raw], 8)
        code, message = rpc_error(slow.select, "slow", candidates(), mechanism="rnm", epsilon=0.5, request_id="r1")
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--principal-share" in message and "--max-concurrent-rpcs" in message
        _innocent(innocent, 10)
        assert ids <= raw.until_closed(ids, 30.0)  # every one ended: the 32 by the receive timeout
        raw.close()
        assert _statuses("Select", "DEADLINE_EXCEEDED")[0] - timed_out0 == 32
        assert once_admitted(lambda: slow.budget("slow")).spent == 0.0  # the refused Select spent nothing
        r = once_admitted(lambda: slow.select("slow", candidates(), mechanism="rnm", epsilon=0.5, request_id="r1"))
        assert not r.replayed
        b = slow.budget("slow")
    assert b.spent == pytest.approx(0.5) and b.requests == 1


def test_a_principal_holds_its_share_of_a_pool_and_its_first_call_fits_any_share() -> None:
    """A pool of 10 with a share of 0.25 (2 units): a principal holding nothing takes any amount
    the pool has room for (a message larger than its share), but nothing more; others go on to the
    total; a principal's units given back are forgotten with it. Anonymous callers are one
    principal per peer address, whatever their port."""
    pool = Shares(10, 0.25)
    assert pool.take_for("a", 6) is None  # a first take beyond the share of 2
    assert pool.take_for("a") is Full.PRINCIPAL
    assert pool.take_for("b") is None and pool.take_for("b") is None
    assert pool.take_for("b") is Full.PRINCIPAL
    assert pool.take_for("c", 3) is Full.TOTAL  # 8 held of 10
    assert pool.take_for("c", 0) is None and pool.held_by("c") == 0
    pool.give_for("a", 6)
    pool.give_for("b", 2)
    assert pool.held == 0 and pool.take_for("a", 10) is None
    assert (
        anonymous_key("ipv4:10.0.0.1:5001")
        == anonymous_key("ipv4:10.0.0.1:6002")
        != anonymous_key("ipv4:10.0.0.2:5001")
    )


@pytest.mark.parametrize("share", [0.0, 1.5, float("nan")])
def test_the_principal_share_must_be_a_fraction(share: float) -> None:
    from recsvc.checks import ParamError

    with pytest.raises(ParamError, match="principal_share"):
        ServerConfig.of("art", principal_share=share).check()
