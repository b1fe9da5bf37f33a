"""MultiSelect through a real server: the k items are the core's response to the signal, the
declared ε is charged on the same ledger as Select (replays spend nothing, no user_id charges
nothing), bad input is refused with nothing spent (a float signal, a lattice point out of range, a
grid step that is not the bundle's, a code out of range, another codebook's version, both kinds of
signal at once among it), the code signal's answer is the randomised-response greedy, an artifact without a bundle refuses the RPC, and
scopes apply as for Select."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow.parquet as papq
import pytest

import recsvc.service.multiselect as multiselect_module
from recsvc.artifact import load_artifact
from recsvc.ledger.export import export
from recsvc.multiselection import Lattice, prototype_codes, respond_code, respond_lattice
from recsvc.service.client import Client
from recsvc.service.testing import BUNDLE_DIM, BUNDLE_RADIUS, candidates, client_of, make_artifact, rpc_error, served
from recsvc.v1 import selection_pb2 as pb

SERVER_OPTIONS = {"budget": 3.0, "max_multiselect_k": 5}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy artifact with a client bundle and population sample."""
    return make_artifact(tmp_path_factory.mktemp("art") / "toy", bundle=True)


@pytest.fixture(scope="module")
def version(artifact: Path) -> str:
    return load_artifact(artifact).client_bundle.version


GRID = Lattice.of(BUNDLE_RADIUS, BUNDLE_DIM)


def _signal(seed: int = 0) -> list[int]:
    """A lattice signal: integers about the size a device's are (the grid has 4096 steps per R)."""
    return np.random.default_rng(seed).integers(-6000, 6000, BUNDLE_DIM).tolist()


def _call(c: Client, **fields: Any) -> pb.MultiSelectRequest:
    """MultiSelect with ``fields``; ``signal`` is the lattice signal and the grid step is the
    bundle's unless given (``float_signal`` sets the refused float field)."""
    fields.setdefault("grid_step", GRID.step)
    if "signal" in fields:
        fields["lattice_signal"] = fields.pop("signal")
    if "float_signal" in fields:
        fields["signal"] = fields.pop("float_signal")
    return c.stub.MultiSelect(pb.MultiSelectRequest(**fields), metadata=c.metadata, timeout=10)


def test_list_mechanisms_reports_the_embedding_and_the_largest_k(client: Client, version: str) -> None:
    info = client.mechanisms()
    assert info.embedding_version == version and len(version) == 64
    assert (info.embedding_dim, info.embedding_radius, info.max_multiselect_k) == (BUNDLE_DIM, BUNDLE_RADIUS, 5)
    assert (info.embedding_grid_step, info.embedding_lattice_radius) == (BUNDLE_RADIUS / 4096, 4096 + BUNDLE_DIM // 2)


def test_the_answer_is_the_core_response_and_the_declared_epsilon_is_charged(
    client: Client, artifact: Path, version: str
) -> None:
    art = load_artifact(artifact)
    s = _signal(1)
    r = _call(client, user_id="ann", request_id="r1", signal=s, embedding_version=version, k=4, epsilon=0.75)
    pop = art.multiselect_population
    rows = respond_lattice(pop, GRID.point(pop.embeddings), np.array(s), 0.75, GRID, 4)
    assert list(r.item_ids) == art.client_bundle.item_ids[rows].tolist() and len(set(r.item_ids)) == 4
    assert (r.charged, r.replayed, r.epsilon_spent, r.budget_remaining, r.request_id) == (True, False, 0.75, 2.25, "r1")
    b = client.budget("ann")
    assert (b.spent, b.requests) == (0.75, 1)
    # The same budget covers Select: 2.25 left, so ε = 2.5 is refused and 2.0 fits.
    code, _ = rpc_error(client.select, "ann", candidates(), mechanism="rnm", epsilon=2.5)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.select("ann", candidates(), mechanism="rnm", epsilon=2.0).budget_remaining == pytest.approx(0.25)


def test_a_retry_returns_the_stored_items_computes_nothing_and_spends_nothing(
    client: Client, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    req = dict(user_id="bea", request_id="same", signal=_signal(2), embedding_version=version, k=3, epsilon=1.0)
    first = _call(client, **req)
    calls: list[int] = []
    real = multiselect_module.respond_lattice

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(multiselect_module, "respond_lattice", counted)
    again = _call(client, **req)
    assert calls == [] and again.replayed and again.charged
    assert (list(again.item_ids), again.epsilon_spent, again.budget_remaining) == (
        list(first.item_ids),
        first.epsilon_spent,
        first.budget_remaining,
    )
    assert (client.budget("bea").spent, client.budget("bea").requests) == (1.0, 1)
    # The same request_id with another signal is a conflict, not a second answer.
    code, _ = rpc_error(_call, client, **{**req, "signal": _signal(3)})
    assert code is grpc.StatusCode.ALREADY_EXISTS
    assert client.budget("bea").spent == 1.0


def test_without_a_user_id_nothing_is_charged_and_the_answer_says_so(client: Client, version: str) -> None:
    r = _call(client, signal=_signal(4), embedding_version=version, k=5, epsilon=2.0)
    assert (r.charged, r.replayed, r.epsilon_spent, r.budget_remaining) == (False, False, 0.0, 0.0)
    assert len(set(r.item_ids)) == 5 and r.request_id


def test_over_budget_is_refused_with_nothing_spent(client: Client, version: str) -> None:
    req = dict(user_id="cat", signal=_signal(5), embedding_version=version, k=2)
    code, _ = rpc_error(_call, client, **req, request_id="big", epsilon=3.5)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.budget("cat").spent == 0.0
    assert _call(client, **req, request_id="fits", epsilon=3.0).budget_remaining == 0.0


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"signal": [1] * (BUNDLE_DIM - 1)},
            rf"lattice_signal has {BUNDLE_DIM - 1} values; expected exactly {BUNDLE_DIM}",
        ),
        (
            {"signal": [1] * (BUNDLE_DIM + 1)},
            rf"lattice_signal has {BUNDLE_DIM + 1} values; expected exactly {BUNDLE_DIM}",
        ),
        ({"signal": []}, rf"lattice_signal has 0 values; expected exactly {BUNDLE_DIM}"),
        (
            {"signal": [], "float_signal": [0.1] * BUNDLE_DIM},
            rf"a float signal \({BUNDLE_DIM} values\), which is not exactly ε-DP; expected code and codebook_version",
        ),
        ({"float_signal": [0.1]}, r"float signal \(1 values\)"),  # refused even beside a lattice signal
        (
            {"signal": [0, 2**53, 0, 0]},
            r"1 lattice_signal value\(s\) are outside ±\(2\*\*53 - 1\) \(first: coordinate 1\)",
        ),
        ({"signal": [0, 0, 0, -(2**63)]}, r"outside ±\(2\*\*53 - 1\) \(first: coordinate 3\)"),
        ({"grid_step": 1 / 1024}, r"grid_step 0\.0009765625 is not this bundle's; expected 0\.000244140625"),
        ({"grid_step": 0.0}, r"grid_step 0\.0 is not this bundle's"),
        ({"k": 0}, r"k=0 is out of range; expected 1 <= k <= 5"),
        ({"k": 6}, r"k=6 is out of range; expected 1 <= k <= 5"),
        ({"embedding_version": "v0"}, r"embedding_version 'v0' is not this server's; expected '[0-9a-f]{64}'"),
        ({"embedding_version": ""}, r"embedding_version '' is not this server's"),
        ({"epsilon": 0.0}, r"epsilon must be a positive finite number, got 0\.0"),
        ({"epsilon": -1.0}, r"epsilon must be a positive finite number"),
        ({"epsilon": float("inf")}, r"epsilon must be a positive finite number, got inf"),
        ({"request_id": "x" * 300}, r"request_id is 300 characters long; expected at most 256"),
    ],
)
def test_bad_input_is_invalid_argument_and_spends_nothing(
    client: Client, version: str, change: dict, message: str
) -> None:
    req = {"user_id": "dan", "request_id": "bad", "signal": _signal(6), "embedding_version": version, "k": 2}
    req["epsilon"] = 0.5
    code, msg = rpc_error(_call, client, **{**req, **change})
    assert code is grpc.StatusCode.INVALID_ARGUMENT and re.search(message, msg), msg
    b = client.budget("dan")
    assert (b.spent, b.requests) == (0.0, 0)


@pytest.mark.parametrize("user_id", ["dan2", ""])
@pytest.mark.parametrize(
    "epsilon, message",
    [
        (1e7, r"epsilon=10000000\.0 is too large for the ledger to count; expected epsilon <= 9223372\.036854775807"),
        (1e-5, r"epsilon=1e-05 is below this server's least epsilon per request, 0\.0001 \(--min-epsilon"),
    ],
)
def test_the_epsilon_range_is_the_same_with_and_without_user_id(
    client: Client, version: str, user_id: str, epsilon: float, message: str
) -> None:
    req = {"user_id": user_id, "signal": _signal(6), "embedding_version": version, "k": 2, "epsilon": epsilon}
    code, msg = rpc_error(_call, client, **req)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and re.search(message, msg), msg
    assert client.budget("dan2").requests == 0


def _code_call(c: Client, **fields: Any) -> pb.MultiSelectResponse:
    return c.stub.MultiSelect(pb.MultiSelectRequest(**fields), metadata=c.metadata, timeout=10)


def test_a_code_signal_is_answered_by_the_randomised_response_greedy_and_charged(
    client: Client, artifact: Path, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = load_artifact(artifact)
    bundle, pop = art.client_bundle, art.multiselect_population
    info = client.mechanisms()
    assert (info.codebook_version, info.code_size) == (bundle.codebook_version, bundle.code_size)
    assert bundle.code_size == 4 and len(bundle.codebook_version) == 64
    codes = prototype_codes(pop, bundle.codebook)
    answers = []
    for code in range(bundle.code_size):
        req = dict(embedding_version=version, codebook_version=bundle.codebook_version, code=code, k=3, epsilon=2.0)
        r = _code_call(client, user_id=f"fay{code}", request_id=f"c{code}", **req)
        want = bundle.item_ids[respond_code(pop, codes, code, 2.0, 3)].tolist()
        assert list(r.item_ids) == want and r.charged and r.epsilon_spent == 2.0
        assert client.budget(f"fay{code}").spent == 2.0
        answers.append(tuple(want))
    assert len(set(answers)) >= 2  # the answer depends on the code
    calls: list[int] = []
    real = multiselect_module.respond_code

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(multiselect_module, "respond_code", counted)
    r = _code_call(
        client, embedding_version=version, codebook_version=bundle.codebook_version, code=1, k=3, epsilon=2.0
    )
    assert list(r.item_ids) == list(answers[1]) and calls == [] and not r.charged  # kept: (code, ε, k) decide it


@pytest.mark.parametrize(
    "change, message",
    [
        ({"code": 4}, r"code 4 is out of range; expected 0 <= code < 4 \(ListMechanisms.code_size\)"),
        ({"code": 2**32 - 1}, r"code 4294967295 is out of range"),
        ({"codebook_version": "old"}, r"codebook_version 'old' is not this server's; expected '[0-9a-f]{64}'"),
        ({"codebook_version": "", "code": 2}, r"carries code 2 without codebook_version"),
        ({"lattice_signal": [1] * BUNDLE_DIM}, r"carries both a code signal \(codebook_version\) and a lattice signal"),
        ({"grid_step": GRID.step}, r"carries both a code signal"),
        ({"signal": [0.1] * BUNDLE_DIM}, r"a float signal"),
    ],
)
def test_a_bad_code_signal_is_invalid_argument_and_spends_nothing(
    client: Client, artifact: Path, version: str, change: dict, message: str
) -> None:
    book = load_artifact(artifact).client_bundle.codebook_version
    req = dict(
        user_id="gus", request_id="bad", embedding_version=version, codebook_version=book, code=1, k=2, epsilon=0.5
    )
    code, msg = rpc_error(_code_call, client, **{**req, **change})
    assert code is grpc.StatusCode.INVALID_ARGUMENT and re.search(message, msg), msg
    b = client.budget("gus")
    assert (b.spent, b.requests) == (0.0, 0)


def test_the_audit_export_shows_the_charges(fresh_client: Client, version: str, tmp_path: Path) -> None:
    _call(fresh_client, user_id="eve", request_id="m1", signal=_signal(7), embedding_version=version, k=2, epsilon=0.5)
    _call(fresh_client, user_id="eve", request_id="m1", signal=_signal(7), embedding_version=version, k=2, epsilon=0.5)
    fresh_client.select("eve", candidates(), mechanism="rnm", epsilon=0.25, request_id="s1")
    _call(fresh_client, signal=_signal(8), embedding_version=version, k=2, epsilon=0.5)  # uncharged: no row
    out = tmp_path / "charges.parquet"
    assert export(tmp_path / "l.db", out, progress=False) == 2
    rows = papq.read_table(out).select(["user_id", "request_id", "mechanism", "epsilon"]).to_pylist()
    assert rows == [
        {"user_id": "eve", "request_id": "m1", "mechanism": "multiselect", "epsilon": 0.5},
        {"user_id": "eve", "request_id": "s1", "mechanism": "rnm", "epsilon": 0.25},
    ]


def test_an_artifact_without_a_bundle_refuses_multiselect_with_failed_precondition(tmp_path: Path) -> None:
    plain = make_artifact(tmp_path / "plain")
    with served(plain, tmp_path / "l.db") as h, client_of(h) as c:
        info = c.mechanisms()
        assert (info.embedding_version, info.embedding_dim, info.max_multiselect_k) == ("", 0, 0)
        code, msg = rpc_error(_call, c, user_id="u", signal=_signal(), embedding_version="x", k=1, epsilon=1.0)
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "MultiSelect is unavailable" in msg
        assert c.budget("u").spent == 0.0


def test_scopes_apply_as_for_select(artifact: Path, tmp_path: Path, version: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("backend-tok service\nalice-tok user:alice\n")
    tokens.chmod(0o600)
    req = dict(request_id="r", signal=_signal(9), embedding_version=version, k=2, epsilon=0.5)
    with served(artifact, tmp_path / "l.db", token_file=tokens) as h:
        target = f"127.0.0.1:{h.port}"
        with Client(target, retries=0) as anon:
            assert rpc_error(_call, anon, user_id="alice", **req)[0] is grpc.StatusCode.UNAUTHENTICATED
        with Client(target, token="alice-tok", retries=0) as alice:
            assert _call(alice, user_id="alice", **req).charged
            assert rpc_error(_call, alice, user_id="bob", **req)[0] is grpc.StatusCode.PERMISSION_DENIED
            # A user-scoped principal cannot get uncharged answers: it must name its own user_id.
            assert rpc_error(_call, alice, **req)[0] is grpc.StatusCode.PERMISSION_DENIED
        with Client(target, token="backend-tok", retries=0) as backend:
            assert _call(backend, user_id="bob", **req).charged
            assert not _call(backend, **req).charged
            assert backend.budget("alice").spent == 0.5


def test_no_log_line_carries_the_signal(client: Client, version: str, caplog: pytest.LogCaptureFixture) -> None:
    s = [123456789, -987654321, 555555555, -444444444]
    with caplog.at_level(logging.DEBUG):
        _call(client, user_id="fay", request_id="log", signal=s, embedding_version=version, k=2, epsilon=0.5)
        rpc_error(_call, client, user_id="fay", signal=[*s, 1], embedding_version=version, k=2, epsilon=0.5)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "MultiSelect" in text  # the observer's debug lines were captured
    assert not any(str(abs(v))[:7] in text for v in s)


def test_prep_to_serve_on_ml100k(ml100k: Path, tmp_path: Path) -> None:
    """A real artifact: a test user's device signal gets k distinct catalog items, the core's answer."""
    from recsvc.device import Device

    art = load_artifact(ml100k)
    bundle = art.client_bundle
    s = Device.of(bundle).signal(["50", "172", "181", "98"], 2.0, np.random.default_rng(0))
    with served(ml100k, tmp_path / "l.db") as h, client_of(h) as c:
        info = c.mechanisms()
        assert (info.embedding_dim, info.embedding_version, info.max_multiselect_k) == (32, bundle.version, 50)
        assert info.embedding_grid_step == bundle.lattice.step == bundle.radius / 4096
        step = bundle.lattice.step
        r = _call(
            c,
            user_id="u",
            signal=s.tolist(),
            grid_step=step,
            embedding_version=info.embedding_version,
            k=10,
            epsilon=2.0,
        )
    pop = art.multiselect_population
    expected = respond_lattice(pop, bundle.lattice.point(pop.embeddings), s, 2.0, bundle.lattice, 10)
    assert list(r.item_ids) == bundle.item_ids[expected].tolist() and len(set(r.item_ids)) == 10
    assert r.charged and r.epsilon_spent == 2.0
