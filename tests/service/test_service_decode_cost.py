"""What decoding a request may cost the server. A SelectBatch whose candidates in all pass
``--max-batch-candidates`` is refused while it is parsed, request by request, and a compressed
request is never decompressed, so a 16 MB batch of empty candidates and its 17.7 kB gzip form are
each refused within 1 CPU-s and 300 MB, while honest calls are answered. The server runs in this
process, so its CPU time and memory include the client's: an upper bound on the server's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import grpc
import psutil
import pytest

from recsvc.service import codec
from recsvc.service.client import Client
from recsvc.service.codec import length_delimited as _field
from recsvc.service.config import Limits
from recsvc.service.server import ServerHandle
from recsvc.service.testing import candidates
from recsvc.v1 import selection_pb2 as pb

MB = 1024 * 1024
Send = Callable[..., tuple[grpc.StatusCode, str]]


def _head(user: str, request_id: str) -> bytes:
    return pb.SelectRequest(user_id=user, mechanism="rnm", epsilon=0.5, request_id=request_id).SerializeToString()


@pytest.fixture(scope="module")
def empty_candidates() -> bytes:
    """1,000 requests × 8,000 empty ``Candidate`` entries: 16 MB, within every per-request limit."""
    request = _head("victim", "r1") + _field(2, b"") * 8000
    return _field(1, request) * 1000


@pytest.fixture(scope="module")
def send(server: ServerHandle) -> Iterator[Send]:
    """Sends raw bytes to a method (SelectBatch by default), compressed or not; the status code and details."""
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", [("grpc.max_send_message_length", 64 * MB)]) as ch:

        def send(
            payload: bytes, compression: grpc.Compression, method: str = "/recsvc.v1.PrivateSelection/SelectBatch"
        ) -> tuple[grpc.StatusCode, str]:
            call = ch.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                call(payload, timeout=60, compression=compression)
            except grpc.RpcError as exc:
                return exc.code(), exc.details()
            return grpc.StatusCode.OK, ""

        yield send


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def _reset_peak() -> str:
    """Resets this process's peak RSS (VmHWM) where the kernel allows it; the field to read after."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # no peak reset here: the RSS after the call is the measure
        return "VmRSS:"
    return "VmHWM:"


@pytest.mark.parametrize(
    ("compression", "refusal"),
    [
        (grpc.Compression.NoCompression, "more than 200000 candidates in all the requests of one SelectBatchRequest"),
        (grpc.Compression.Gzip, "or a compressed message: this server never decompresses requests"),
    ],
    ids=["plain", "gzip"],
)
def test_a_16_mb_batch_of_empty_candidates_is_refused_within_1_cpu_s_and_300_mb(
    compression: grpc.Compression,
    refusal: str,
    empty_candidates: bytes,
    send: Send,
    server: ServerHandle,
    client: Client,
) -> None:
    me = psutil.Process()
    before = server.ledger.totals()
    rss, peak = _status_mb("VmRSS:"), _reset_peak()
    cpu = sum(me.cpu_times()[:2])
    code, details = send(empty_candidates, compression)
    spent_cpu, grown = sum(me.cpu_times()[:2]) - cpu, _status_mb(peak) - rss
    assert code is grpc.StatusCode.INVALID_ARGUMENT and refusal in details, (code, details)
    assert spent_cpu <= 1.0 and grown <= 300, (spent_cpu, grown)  # parsed whole and checked: 30 CPU-s, +1 GB
    assert server.ledger.totals() == before
    if compression is grpc.Compression.Gzip:  # any method; a message gzip cannot shrink goes uncompressed
        small = pb.GetBudgetRequest(user_id="v" * 200).SerializeToString()  # its field 1 is Health's `service`
        for method in ("/recsvc.v1.PrivateSelection/GetBudget", "/grpc.health.v1.Health/Check"):
            code, details = send(small, compression, method)
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "compressed" in details, (method, code, details)
    user = f"honest-{compression.name}"
    assert client.select(user, candidates(), mechanism="rnm", epsilon=0.5).epsilon_spent == 0.5
    reqs = [client.select_request(user, candidates(), mechanism="rnm", epsilon=0.25) for _ in range(2)]
    assert [r.response.epsilon_spent for r in client.select_batch(reqs)] == [0.25, 0.25]


# how the batch is parsed → (WHOLE_BATCH, SCANNED_ITEM), and what its requests count in all
PARSINGS = {"at once": (codec.WHOLE_BATCH, codec.SCANNED_ITEM, 8), "field by field": (0, codec.SCANNED_ITEM, 8)}
PARSINGS["each request scanned first"] = (0, 0, 13)  # a scan counts the fields it walked: 5 + 3 + 5


@pytest.mark.parametrize("parsing", PARSINGS)
def test_a_batch_is_parsed_alike_within_its_total_and_refused_past_it(
    parsing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However a batch is parsed, it is the message protobuf parses at once (unknown fields
    included); a request's candidates are the most entries of its counted fields, and the request
    that takes the sum past ``max_batch_candidates`` refuses the batch."""
    whole, scanned, total = PARSINGS[parsing]
    monkeypatch.setattr(codec, "WHOLE_BATCH", whole)
    monkeypatch.setattr(codec, "SCANNED_ITEM", scanned)
    ids = pb.SelectRequest(item_ids=["a", "b", "c"], scores=[1, 2, 3], user_id="u").SerializeToString()
    rows = pb.SelectRequest(item_rows=[1, 2], scores=[1, 2], catalog_version="v").SerializeToString()
    batch = _field(1, ids) + _field(31, b"unknown") + _field(1, rows) + _field(1, ids)  # 3 + 2 + 3 candidates
    at_once = pb.SelectBatchRequest.FromString(batch)
    limits = Limits(max_candidates=3, max_batch_candidates=total)  # every request at its limit
    parsed = codec.decoder(pb.SelectBatchRequest, codec.BATCH, limits)(batch)
    assert parsed == at_once and parsed.SerializeToString() == at_once.SerializeToString()
    refusal = rf"^more than {total - 1} candidates in all the requests of one SelectBatchRequest"
    with pytest.raises(codec.Refused, match=refusal):
        codec.decoder(pb.SelectBatchRequest, codec.BATCH, replace(limits, max_batch_candidates=total - 1))(batch)
