"""Oversized and malformed requests, sent through real gRPC channels as raw bytes: oversized and
malformed messages are refused before any per-item work (INVALID_ARGUMENT, nothing spent, no
traceback), and authentication runs before decoding. Time and memory are measured by
python -m scripts.bench.refusals, not here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from recsvc.service import codec
from recsvc.service.client import Client
from recsvc.service.codec import length_delimited as _field
from recsvc.service.config import Limits, ServerConfig
from recsvc.service.server import ServerHandle, start
from recsvc.service.testing import candidates
from recsvc.v1 import selection_pb2 as pb

SERVICE = "/recsvc.v1.PrivateSelection/"


def _identity(b: bytes) -> bytes:  # the (de)serializer of raw bytes: they go on the wire as they are
    return b


def _head(**over) -> bytes:
    """A valid SelectRequest without candidates (user, mechanism, ε, request id)."""
    return pb.SelectRequest(
        **{"user_id": "victim", "mechanism": "rnm", "epsilon": 0.5, "request_id": "r1", **over}
    ).SerializeToString()


def _candidates_3m() -> bytes:
    """3,000,000 one-character candidates, a 15 MB message."""
    return _head() + _field(2, _field(1, b"x")) * 3_000_000


# case → (method, the message's bytes (built when the case runs), what the refusal must say)
OVERSIZED: dict[str, tuple[str, Callable[[], bytes], str]] = {
    "3M candidates": (
        "Select",
        _candidates_3m,
        "more than 10000 candidates in one SelectRequest; this server accepts at most 10000",
    ),
    "3M item_ids": (
        "Select",
        lambda: _head() + _field(9, b"x") * 3_000_000,
        "more than 10000 item_ids in one SelectRequest",
    ),
    "1.5M packed scores": (
        "Select",
        lambda: _head() + _field(10, b"\0" * 8 * 1_500_000),  # one run, 12 MB
        "more than 10000 scores in one SelectRequest",
    ),
    "3M packed item rows": (
        "Select",
        lambda: _head() + _field(12, b"\x01" * 3_000_000),  # one run, 3 MB
        "more than 10000 item_rows in one SelectRequest",
    ),
    "3M unknown fields": (
        "Select",
        lambda: _head() + b"\xf8\x01\x00" * 3_000_000,  # field 31 = 0
        "more than 40064 fields in one SelectRequest",
    ),
    "user_id sent 3M times": (
        "Select",
        lambda: _field(1, b"v") * 3_000_000,
        "more than 40064 fields in one SelectRequest",
    ),
    "5M history entries": (
        "Recommend",
        lambda: (
            pb.RecommendRequest(user_id="victim", mechanism="rnm", epsilon=0.5).SerializeToString()
            + _field(2, b"x") * 5_000_000
        ),
        "more than 10000 history entries in one RecommendRequest",
    ),
    "10M packed lattice_signal values": (
        "MultiSelect",
        lambda: (
            pb.MultiSelectRequest(user_id="victim", k=1, epsilon=0.5).SerializeToString()
            + _field(7, b"\x02" * 10_000_000)
        ),
        "more than 10000 lattice_signal in one MultiSelectRequest",
    ),
    "1001 requests in a batch": (
        "SelectBatch",
        lambda: _field(1, _head()) * 1001,
        "more than 1000 requests in one SelectBatchRequest",
    ),
    "a batch item of 3M candidates": (
        "SelectBatch",
        lambda: _field(1, _head()) + _field(1, _candidates_3m()),
        "requests[1]: more than 10000 candidates in one SelectRequest",
    ),
}


@pytest.fixture(scope="module")
def channel(server: ServerHandle) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", [("grpc.max_send_message_length", 64 << 20)]) as ch:
        yield ch


def _raw(
    channel: grpc.Channel, method: str, payload: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> tuple[grpc.StatusCode, str]:
    call = channel.unary_unary(
        method if method.startswith("/") else SERVICE + method,
        request_serializer=_identity,
        response_deserializer=_identity,
    )
    try:
        call(payload, timeout=60, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.DEBUG):
        yield
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()]
    assert not bad, [r.getMessage()[:300] for r in bad]


@pytest.mark.parametrize("case", OVERSIZED)
def test_oversized_requests_are_refused_before_parsing(
    case: str, channel: grpc.Channel, server: ServerHandle, monkeypatch: pytest.MonkeyPatch, no_errors_logged: None
) -> None:
    method, build, message = OVERSIZED[case]
    payload = build()
    parsed: list[str] = []

    def counted(real: Callable[[bytes], object]) -> Callable[[bytes], object]:
        def from_string(data: bytes) -> object:
            parsed.append("parsed")
            return real(data)

        return from_string

    for message_type in (pb.SelectRequest, pb.RecommendRequest, pb.SelectBatchRequest, pb.MultiSelectRequest):
        monkeypatch.setattr(message_type, "FromString", counted(message_type.FromString))
    before = server.ledger.totals()
    code, details = _raw(channel, method, payload)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and message in details, (code, details)
    assert parsed == []  # refused on the raw bytes: no message (and no Candidate) was ever built
    assert server.ledger.totals() == before and server.ledger.lookup("victim", "r1") is None
    control = _head(user_id="control", request_id=case) + _field(9, b"it1") + _field(10, b"\0" * 8)
    assert _raw(channel, "Select", control) == (grpc.StatusCode.OK, "") and parsed == ["parsed"]  # the spy works


def test_the_pre_scan_refuses_without_parsing() -> None:
    """The parser is never called for an oversized request; at the limit it is, once. A batch's
    items are checked one by one (test_service_decode_cost.py shows what each is parsed into)."""
    calls: list[int] = []

    def spy(message_type: type[pb.SelectRequest]) -> type:
        class Spy:
            @staticmethod
            def FromString(data: bytes) -> object:
                calls.append(len(data))
                return message_type.FromString(data)

        return Spy

    Spy = spy(pb.SelectRequest)
    decode = codec.decoder(Spy, codec.SELECT, Limits())
    with pytest.raises(codec.Refused, match="more than 10000 candidates"):
        decode(_candidates_3m())
    assert calls == []
    ok = _head() + b"".join(_field(2, pb.Candidate(item_id=i, score=s).SerializeToString()) for i, s in candidates())
    assert decode(ok).user_id == "victim" and calls == [len(ok)]
    limits = Limits(max_candidates=20)  # candidates() has 20: exactly at the limit, accepted
    assert len(codec.decoder(Spy, codec.SELECT, limits)(ok).candidates) == 20
    over = ok + _field(2, pb.Candidate(item_id="it39").SerializeToString())
    with pytest.raises(codec.Refused, match="more than 20 candidates"):
        codec.decoder(Spy, codec.SELECT, limits)(over)
    assert calls == [len(ok), len(ok)]
    batch = pb.SelectBatchRequest(requests=[pb.SelectRequest.FromString(ok)] * 3).SerializeToString()
    decode_batch = codec.decoder(pb.SelectBatchRequest, codec.BATCH, Limits(max_batch=3, max_candidates=20))
    assert len(decode_batch(batch).requests) == 3
    with pytest.raises(codec.Refused, match=r"^more than 2 requests"):
        codec.decoder(pb.SelectBatchRequest, codec.BATCH, Limits(max_batch=2, max_candidates=20))(batch)
    with pytest.raises(codec.Refused, match=r"^requests\[3\]: more than 20 candidates"):
        codec.decoder(pb.SelectBatchRequest, codec.BATCH, limits)(batch + _field(1, over))


def test_history_and_batch_limits_are_configurable(artifact: Path, tmp_path: Path) -> None:
    h = start(
        ServerConfig.of(
            artifacts=artifact,
            port=0,
            ledger=tmp_path / "l.db",
            max_history=3,
            max_batch=2,
            max_message_bytes=64 * 1024,
        )
    )
    try:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            assert c.recommend("u", ["it1", "it2", "it3"], mechanism="rnm", epsilon=0.5).epsilon_spent == 0.5
            with pytest.raises(grpc.RpcError) as info:
                c.recommend("u", ["it1", "it2", "it3", "it4"], mechanism="rnm", epsilon=0.5)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (
                "more than 3 history entries in one RecommendRequest; this server accepts at most 3"
                in info.value.details()
            )
            reqs = [c.select_request("u", candidates(), mechanism="rnm", epsilon=0.5) for _ in range(3)]
            with pytest.raises(grpc.RpcError) as info:
                c.select_batch(reqs)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "at most 2" in info.value.details()
            # Larger than max_message_bytes: gRPC refuses it unread (RESOURCE_EXHAUSTED).
            with pytest.raises(grpc.RpcError) as info:
                c.recommend("u", ["it1"] * 20_000, mechanism="rnm", epsilon=0.5)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert h.ledger.totals() == {"u": pytest.approx(0.5)}
    finally:
        h.stop(1)


MALFORMED = {
    "truncated varint": b"\x0a\xff",
    "length past the end": b"\x0a\x05ab",
    "unterminated group": b"\x0b",
    "field number 0": b"\x00\x00",
    "bad UTF-8 in user_id": b"\x0a\x02\xff\xfe",
    "all 0xff": b"\xff" * 64,
    # > 20 KB, so the pre-scan walks it (500 unknown fields of 100 bytes), then a value past the end.
    "long, truncated at the end": _field(31, b"u" * 100) * 500 + b"\xfa\x01\x05x",
}


@pytest.mark.parametrize(
    "method", ["Select", "SelectBatch", "Recommend", "GetBudget", "ListMechanisms", "/grpc.health.v1.Health/Check"]
)
def test_malformed_bytes_are_invalid_argument_without_a_traceback(
    method: str, channel: grpc.Channel, server: ServerHandle, no_errors_logged: None
) -> None:
    before = server.ledger.totals()
    for name, payload in MALFORMED.items():
        if method == "ListMechanisms" and name in ("bad UTF-8 in user_id", "field number 0"):
            continue  # the parser accepts both for a message without fields (field 1 is unknown there)
        code, details = _raw(channel, method, payload)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (name, code, details)
        assert "not a valid" in details and "\\x" not in details
    assert server.ledger.totals() == before


def test_authentication_runs_before_decoding(artifact: Path, tmp_path: Path, no_errors_logged: None) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("good-token user:victim\n")
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", token_file=tokens))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{h.port}", [("grpc.max_send_message_length", 64 << 20)]) as ch:
            for payload in (MALFORMED["truncated varint"], _candidates_3m()):
                for auth in ((), (("authorization", "Bearer wrong"),)):
                    assert _raw(ch, "Select", payload, auth)[0] is grpc.StatusCode.UNAUTHENTICATED
                assert (
                    _raw(ch, "Select", payload, (("authorization", "Bearer good-token"),))[0]
                    is grpc.StatusCode.INVALID_ARGUMENT
                )
            # The scope check needs the user_id, so it follows decoding; a foreign one spends nothing.
            assert (
                _raw(
                    ch,
                    "Select",
                    _head(user_id="other") + _field(9, b"it1") + _field(10, b"\0" * 8),
                    (("authorization", "Bearer good-token"),),
                )[0]
                is grpc.StatusCode.PERMISSION_DENIED
            )
        assert h.ledger.totals() == {}
    finally:
        h.stop(1)


def test_malformed_bytes_on_a_streaming_method(channel: grpc.Channel, no_errors_logged: None) -> None:
    """Server reflection is stream-stream: each message is decoded by the gate the same safe way."""
    call = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=_identity,
        response_deserializer=_identity,
    )
    with pytest.raises(grpc.RpcError) as info:
        list(call(iter([MALFORMED["length past the end"]]), timeout=30))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "not a valid" in info.value.details()


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 300_000])
def test_a_length_delimited_field_reads_back_through_the_scan_and_through_protobuf(size: int) -> None:
    """The raw encoder the refusal tests build their messages with: lengths on both sides of each
    varint byte boundary, a field number past 15 (a two-byte tag), read back by :func:`codec.fields`
    and by protobuf's own parser (which keeps the unknown field 17 aside)."""
    payload = bytes(97 + i % 26 for i in range(size))  # ASCII: field 3 is a string
    data = _field(1, b"user") + _field(17, b"x") + _field(3, payload)
    starts = [(n, t, data[s:e]) for n, t, s, e in codec.fields(data, 0, len(data))]
    assert starts == [(1, 2, b"user"), (17, 2, b"x"), (3, 2, payload)]
    req = pb.SelectRequest.FromString(data)
    assert (req.user_id, req.mechanism) == ("user", payload.decode())


def _refuse(raw: bytes) -> None:
    from recsvc.service.errors import Refused

    raise Refused("the request is over the limit")


def _refuse_a_parse_error(raw: bytes) -> None:
    from recsvc.service.errors import Refused

    try:
        raise ValueError("protobuf could not parse it")
    except ValueError:
        raise Refused("the request is not a valid recsvc.v1.SelectRequest") from None  # still its __context__


@pytest.mark.parametrize("refuse", [_refuse, _refuse_a_parse_error], ids=["pre-scan", "parse-error"])
def test_a_refused_message_is_released_without_the_cycle_collector(refuse: Callable[[bytes], None]) -> None:
    """The gate's refusal keeps no traceback and no chained exception: their frames hold the raw
    request, so either would pin every refused message (up to the size limit) until a collection."""
    import gc
    import sys

    from recsvc.service.interceptors import Abort, Gate

    gate = Gate(authenticator=None)  # type: ignore[arg-type]  # _decode never authenticates
    raw = bytes(1_000_000)
    before = sys.getrefcount(raw)
    gc.disable()
    try:
        with pytest.raises(Abort) as info:
            gate._decode(refuse, raw, "/recsvc.v1.PrivateSelection/Select")
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
        del info
        assert sys.getrefcount(raw) == before
    finally:
        gc.enable()
