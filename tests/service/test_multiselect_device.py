"""The Python multi-selection device: Client.multiselect sends ONLY its code (its best codebook
item) by exact randomised response and the codebook version, or (signal="lattice") its embedding
rounded to the bundle's lattice plus exact discrete Laplace noise from the CSPRNG and the grid
step, and re-ranks the server's k items with the true SANSA scores.

The wire test runs a real gRPC server whose MultiSelect handler records the raw request bytes:
what a server operator could see is exactly what it asserts on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest

from recsvc.app.cli import main
from recsvc.checks import ParamError
from recsvc.device import Device
from recsvc.multiselection import rate
from recsvc.service.client import Client
from recsvc.v1 import selection_pb2 as pb

D, RADIUS = 6, 1.5  # the conftest bundle's d and R
HISTORY = ["it3", "it17", "it29", "it17", "not-an-item"]  # a duplicate and an unknown id
# MultiSelectRequest's field numbers: user_id, request_id, embedding_version, k, epsilon, then
# code and codebook_version (the code signal; code 0 is not on the wire) or lattice_signal and
# grid_step (3, the refused float signal, is never sent).
COMMON_FIELDS = {1, 2, 4, 5, 6}
CODE_FIELDS, LATTICE_FIELDS = {9, 10}, {7, 8}


@pytest.fixture(scope="module")
def device(bundle) -> Device:
    return Device.load(bundle)


def _wire_fields(raw: bytes) -> list[int]:
    """The field numbers of a protobuf message's top-level fields, straight from its bytes."""

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = raw[at]
            value |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if byte < 0x80:
                return value, at

    fields, at = [], 0
    while at < len(raw):
        tag, at = varint(at)
        number, kind = tag >> 3, tag & 7
        fields.append(number)
        if kind == 0:
            _, at = varint(at)
        elif kind == 1:
            at += 8
        elif kind == 2:
            size, at = varint(at)
            at += size
        elif kind == 5:
            at += 4
        else:
            raise AssertionError(f"unexpected wire type {kind}")
    return fields


class Capture:
    """A real gRPC server whose MultiSelect records each request's bytes and answers ``items``;
    the first ``fail`` calls are refused with UNAVAILABLE (a client retries them)."""

    def __init__(self, items: list[str], fail: int = 0) -> None:
        self.items, self.fail = items, fail
        self.received: list[bytes] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        handler = grpc.unary_unary_rpc_method_handler(self._handle)  # no deserializer: raw bytes
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("recsvc.v1.PrivateSelection", {"MultiSelect": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _handle(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        self.received.append(raw)
        if len(self.received) <= self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        req = pb.MultiSelectRequest.FromString(raw)
        resp = pb.MultiSelectResponse(
            item_ids=self.items[: req.k], epsilon_spent=req.epsilon, charged=True, request_id=req.request_id
        )
        return resp.SerializeToString()


@pytest.fixture
def capture() -> Iterator[Capture]:
    cap = Capture(["it3", "it8", "it5", "it12", "it30", "it1"], fail=1)
    try:
        yield cap
    finally:
        cap.server.stop(None)


def test_the_device_embeds_the_distinct_known_history_items_and_clips_them(device) -> None:
    rows = device.rows(HISTORY)
    assert rows.tolist() == [3, 17, 29]
    rows[0] = 99  # the device keeps its last histories' rows: a caller's write changes none of them
    assert device.rows(HISTORY).tolist() == [3, 17, 29] and device.rows(HISTORY[:1]).tolist() == [3]
    for i in range(12):  # more histories than it keeps: each still gets its own rows
        assert device.rows([f"it{i}", "it39", "ghost"]).tolist() == sorted({i, 39})
    raw = device.factors[[3, 17, 29]].sum(axis=0) / np.sqrt(3)
    assert np.abs(raw).sum() > RADIUS  # the clip is exercised
    np.testing.assert_allclose(device.embedding(HISTORY), raw * RADIUS / np.abs(raw).sum(), rtol=1e-15)
    assert np.abs(device.embedding(HISTORY)).sum() == pytest.approx(RADIUS, rel=1e-12)
    assert device.embedding([]).tolist() == [0.0] * D
    with pytest.raises(ParamError, match="one row per item"):
        Device(device.model, device.factors[:-1], RADIUS, "v", device.codebook, "c")
    with pytest.raises(ParamError, match="the codebook must be"):
        Device(device.model, device.factors, RADIUS, "v", np.array([3, 3]), "c")


def test_the_signal_is_the_lattice_point_plus_discrete_laplace_of_rate_epsilon_over_delta(device) -> None:
    eps = 0.8
    grid = device.lattice
    point = grid.point(device.embedding(HISTORY))
    noise = np.stack([device.signal(HISTORY, eps, np.random.default_rng(s)) for s in range(400)]) - point
    assert noise.dtype == np.int64
    s, t = rate(eps, grid.sensitivity)
    # E|X| of P(x) ∝ q^|x| is 2q/(1 − q²); 2,400 draws hold the mean to about 2 % of it.
    q = np.exp(-s / t)
    want = 2 * q / (1 - q * q)
    assert abs(np.abs(noise).mean() / want - 1) < 0.08
    assert abs(noise.mean()) < 0.08 * want


def test_the_device_keeps_the_best_true_score_and_never_a_history_item(device) -> None:
    items = ["it3", "it8", "it5", "it12", "it30", "it1"]
    truth = device.model.score_one(device.rows(HISTORY))  # the full scoring, independent of score_items
    got = device.scores(HISTORY, items)
    assert got[0] == -np.inf  # it3 is in the history
    rows = [device.model.index[i] for i in items[1:]]
    np.testing.assert_allclose(got[1:], truth[rows], rtol=1e-12)
    assert items[device.choose(HISTORY, items)] == items[1 + int(np.argmax(truth[rows]))]
    with pytest.raises(ParamError, match="not in the client bundle"):
        device.scores(HISTORY, ["it1", "ghost"])


def test_the_wire_carries_the_code_and_nothing_else_from_the_history(device, bundle, capture) -> None:
    with Client(f"127.0.0.1:{capture.port}", retries=2) as c:
        for i in range(6):  # several draws: the code is sometimes 0, which proto3 leaves off the wire
            c.multiselect("alice", HISTORY, epsilon=0.5, k=4, device=device, request_id=f"rq-c{i}")
    assert len(capture.received) == 7 and capture.received[0] == capture.received[1]  # the retry: no fresh draw
    sent = capture.received[1:]
    codes = set()
    for raw in sent:
        assert COMMON_FIELDS | {10} <= set(_wire_fields(raw)) <= COMMON_FIELDS | CODE_FIELDS
        req = pb.MultiSelectRequest.FromString(raw)
        assert req.codebook_version == device.codebook_version and 0 <= req.code < device.code_size
        assert len(req.lattice_signal) == 0 and req.grid_step == 0.0 and len(req.signal) == 0
        assert all(item.encode() not in raw for item in HISTORY)
        codes.add(req.code)
    assert len(codes) >= 2  # at ε = 0.5 and C = 4 the true code is sent about 35 % of the time


def test_the_wire_carries_the_lattice_signal_and_nothing_else_from_the_history(device, bundle, capture) -> None:
    with Client(f"127.0.0.1:{capture.port}", retries=2) as c:
        r = c.multiselect("alice", HISTORY, epsilon=0.5, k=4, device=device, request_id="rq-1", signal="lattice")
    assert len(capture.received) == 2  # refused once, retried
    assert capture.received[0] == capture.received[1]  # the retry resends the same signal: no fresh draw
    raw = capture.received[1]
    assert set(_wire_fields(raw)) == COMMON_FIELDS | LATTICE_FIELDS
    req = pb.MultiSelectRequest.FromString(raw)
    assert {f.name for f, _ in req.ListFields()} == {
        "user_id",
        "request_id",
        "lattice_signal",
        "grid_step",
        "embedding_version",
        "k",
        "epsilon",
    }
    assert (req.user_id, req.request_id, req.k, req.epsilon) == ("alice", "rq-1", 4, 0.5)
    assert (
        req.embedding_version
        == device.version
        == json.loads((bundle / "manifest.json").read_text())["embedding_version"]
    )
    assert len(req.lattice_signal) == D and len(req.signal) == 0 and req.grid_step == RADIUS / 4096
    assert list(req.lattice_signal) != device.lattice.point(device.embedding(HISTORY)).tolist()  # noise was added
    for item in HISTORY:
        assert item.encode() not in raw
    items = ["it3", "it8", "it5", "it12"]
    assert r.item_ids == items and r.item_id == items[device.choose(HISTORY, items)] and r.item_id != "it3"
    assert (r.epsilon_spent, r.charged, r.request_id) == (0.5, True, "rq-1")


def test_a_repeated_request_id_resends_its_signal_and_other_inputs_under_it_are_refused(device, capture) -> None:
    with Client(f"127.0.0.1:{capture.port}", retries=2) as c:
        c.multiselect("alice", HISTORY, epsilon=0.5, k=2, device=device, request_id="same")
        c.multiselect("alice", HISTORY[::-1], epsilon=0.5, k=2, device=device, request_id="same")  # same rows
        assert len(capture.received) == 3 and capture.received[1] == capture.received[2]
        for hist, eps, k, kind in (
            (HISTORY[:1], 0.5, 2, "code"),
            (HISTORY, 0.6, 2, "code"),
            (HISTORY, 0.5, 3, "code"),
            (HISTORY, 0.5, 2, "lattice"),
        ):
            with pytest.raises(ParamError, match="'same' was already sent by this device"):
                c.multiselect("alice", hist, epsilon=eps, k=k, device=device, request_id="same", signal=kind)
        c.multiselect("bob", HISTORY, epsilon=0.5, k=2, device=device, request_id="same")  # request ids are per user
    assert len(capture.received) == 4 and capture.received[3] != capture.received[2]
    with Client(f"127.0.0.1:{capture.port}", retries=0) as c, pytest.raises(ParamError, match="signal must be one of"):
        c.multiselect("alice", HISTORY, epsilon=0.5, k=2, device=device, signal="float")
    assert len(capture.received) == 4


def test_two_requests_draw_independent_signals(device, bundle, capture) -> None:
    with Client(f"127.0.0.1:{capture.port}", retries=2) as c:
        c.multiselect("alice", HISTORY, epsilon=0.5, k=2, device=device, signal="lattice")
        c.multiselect("alice", HISTORY, epsilon=0.5, k=2, device=str(bundle), signal="lattice")  # loaded once
        assert list(c.devices) == [str(bundle)]
    first, second = (pb.MultiSelectRequest.FromString(b) for b in capture.received[1:])
    assert list(first.lattice_signal) != list(second.lattice_signal) and first.request_id != second.request_id


@pytest.mark.parametrize(
    ("epsilon", "k", "match"),
    [(0.0, 3, "epsilon must be a positive"), (float("nan"), 3, "epsilon must be a positive"), (1.0, 0, "k must be")],
)
def test_bad_input_is_refused_before_anything_is_sent(device, capture, epsilon, k, match) -> None:
    with Client(f"127.0.0.1:{capture.port}", retries=0) as c, pytest.raises(ParamError, match=match):
        c.multiselect("alice", HISTORY, epsilon=epsilon, k=k, device=device)
    assert capture.received == []


def test_the_noise_comes_from_the_csprng_unless_a_generator_is_given(device) -> None:
    c = Client("127.0.0.1:1", retries=0)
    try:
        a = c.multiselect_request("u", HISTORY, 1.0, 2, device, rng=np.random.default_rng(9), signal="lattice")
        b = c.multiselect_request("u", HISTORY, 1.0, 2, device, rng=np.random.default_rng(9), signal="lattice")
        fresh = c.multiselect_request("u", HISTORY, 1.0, 2, device, signal="lattice")
    finally:
        c.close()
    assert list(a.lattice_signal) == list(b.lattice_signal) != list(fresh.lattice_signal)


def test_the_command_line_device_prints_its_choice_and_the_k_items(device, bundle, capture, capsys) -> None:
    hist = ["it3", "it17", "it29"]
    target = ["--target", f"127.0.0.1:{capture.port}", "--bundle", str(bundle)]
    code = main(["multiselect", *target, "--user", "carol", "--history", *hist, "--epsilon", "2", "--k", "3"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    items = ["it3", "it8", "it5"]
    assert out["item_ids"] == items and out["item_id"] == items[device.choose(hist, items)]
    assert (out["epsilon_spent"], out["charged"]) == (2.0, True)
    req = pb.MultiSelectRequest.FromString(capture.received[-1])
    assert (req.user_id, req.request_id, req.k, req.epsilon, req.codebook_version) == (
        "carol",
        out["request_id"],
        3,
        2.0,
        device.codebook_version,
    )
    assert all(h.encode() not in capture.received[-1] for h in hist)
    assert main(["multiselect", *target, "--history", *hist, "--epsilon", "2", "--k", "3", "--signal", "lattice"]) == 0
    assert len(pb.MultiSelectRequest.FromString(capture.received[-1]).lattice_signal) == D


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--epsilon", "0"], "--epsilon must be a finite number > 0, got 0"),
        (["--epsilon", "1", "--k", "0"], "--k must be an integer ≥ 1, got 0"),
        (["--epsilon", "1", "--bundle", "/nonexistent/client"], "is not a client bundle"),
    ],
)
def test_the_command_line_device_refuses_bad_flags_before_sending(
    bundle, capture, one_line_error, flags, match
) -> None:
    given = flags if "--bundle" in flags else ["--bundle", str(bundle), *flags]
    assert main(["multiselect", "--target", f"127.0.0.1:{capture.port}", "--history", "it3", *given]) == 2
    one_line_error(match)
    assert capture.received == []
