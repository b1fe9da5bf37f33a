"""The PrivateSelection API through real gRPC channels against in-process servers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from recsvc.artifact import load_artifact
from recsvc.mechanisms import probabilities
from recsvc.service.client import Client
from recsvc.service.config import ServerConfig
from recsvc.service.server import ServerHandle, start
from recsvc.service.testing import AUDIT_ALPHA, candidates, make_artifact, rpc_error
from recsvc.v1 import selection_pb2 as pb

BUDGET = 10.0
# the module's server (conftest.py); no ε floor: the ledger's own unit is tested
SERVER_OPTIONS = {"budget": BUDGET, "max_candidates": 25, "min_epsilon": 0.0}


def test_select_replay_and_conflict(client: Client, server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    import recsvc.service.requests as requests_module

    draws: list[str] = []
    real_slate = requests_module.draw_slate

    def counted(v: Any, rng: Any) -> Any:
        draws.append(v.mechanism)
        return real_slate(v, rng)

    monkeypatch.setattr(requests_module, "draw_slate", counted)
    cands = candidates()
    r = client.select("replay-user", cands, mechanism="rnm", epsilon=0.5, request_id="req-1")
    assert r.mechanism == "rnm" and r.epsilon_spent == 0.5 and r.budget_remaining == pytest.approx(BUDGET - 0.5)
    assert r.item_id in dict(cands) and r.request_id == "req-1" and not r.replayed
    assert list(r.item_ids) == [r.item_id]  # one item: a slate of one
    for _ in range(5):  # a retry returns the SAME stored answer and spends nothing
        again = client.select("replay-user", cands, mechanism="rnm", epsilon=0.5, request_id="req-1")
        assert (again.item_id, again.budget_remaining, again.replayed) == (r.item_id, r.budget_remaining, True)
    assert draws == ["rnm"]  # one sample for the original; a retry never draws a fresh one
    assert client.budget("replay-user").spent == pytest.approx(0.5)
    # Same request_id with other parameters: refused (no fresh sample), nothing spent.
    for kwargs in ({"epsilon": 0.6}, {"mechanism": "em"}, {"beta": 0.1}):
        params = {"mechanism": "rnm", "epsilon": 0.5, **kwargs}
        code, msg = rpc_error(client.select, "replay-user", cands, request_id="req-1", **params)
        assert code is grpc.StatusCode.ALREADY_EXISTS and "different parameters" in msg
    assert draws == ["rnm"]  # ... and neither does a conflicting reuse of the request_id
    changed = [(i, s + 0.1) for i, s in cands]
    assert (
        rpc_error(client.select, "replay-user", changed, mechanism="rnm", epsilon=0.5, request_id="req-1")[0]
        is grpc.StatusCode.ALREADY_EXISTS
    )
    # request_ids are scoped per user.
    other = client.select("replay-user-2", cands, mechanism="rnm", epsilon=0.5, request_id="req-1")
    assert not other.replayed
    assert client.budget("replay-user").spent == pytest.approx(0.5)
    assert server.ledger.user("replay-user").requests == 1


def _good(encoding: str = "candidates", **over) -> pb.SelectRequest:
    """A valid request in either candidate encoding, with fields overridden by ``over``."""
    req = pb.SelectRequest(user_id="victim", mechanism="rnm", epsilon=0.5, request_id="bad-1")
    for k, v in {"candidates": candidates(10), **over}.items():
        if k != "candidates":
            setattr(req, k, v)
        elif encoding == "candidates":
            req.candidates.extend(pb.Candidate(item_id=i, score=s) for i, s in v)
        else:
            req.item_ids.extend(i for i, _ in v)
            req.scores.extend(s for _, s in v)
    return req


def test_both_candidate_encodings_agree_and_cannot_be_mixed(client: Client, server: ServerHandle) -> None:
    a = server.servicer.prepare_select(_good("candidates"))
    b = server.servicer.prepare_select(_good("columns"))
    assert a.item_ids == b.item_ids == [i for i, _ in candidates(10)]
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.sensitivities, b.sensitivities)
    for enc in ("candidates", "columns"):
        r = client.stub.Select(_good(enc, user_id="enc", request_id=enc))
        assert r.item_id in a.item_ids and r.mechanism == "rnm"
    mixed = _good("candidates", user_id="enc", request_id="e3")
    mixed.item_ids.append("it1")
    mixed.scores.append(0.5)
    code, msg = rpc_error(client.stub.Select, mixed)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "expected exactly one encoding" in msg
    short = _good("columns", user_id="enc", request_id="e4")
    short.scores.append(0.5)
    code, msg = rpc_error(client.stub.Select, short)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "item_ids has 10 entries but scores has 11" in msg
    assert client.budget("enc").requests == 2


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "nan score": (dict(candidates=[("it1", 0.5), ("it2", math.nan)]), "NaN or infinite"),
    "inf score": (dict(candidates=[("it1", math.inf), ("it2", 0.1)]), "NaN or infinite"),
    "epsilon 0": (dict(epsilon=0.0), "epsilon must be a positive finite"),
    "epsilon negative": (dict(epsilon=-1.0), "epsilon must be a positive finite"),
    "epsilon nan": (dict(epsilon=math.nan), "epsilon must be a positive finite"),
    "epsilon inf": (dict(epsilon=math.inf), "epsilon must be a positive finite"),
    "beta 0": (dict(mechanism="gem", beta=0.0), "beta must be in the open interval (0, 1)"),
    "beta 1": (dict(mechanism="gem", beta=1.0), "beta must be in the open interval (0, 1)"),
    "gamma 1.5": (dict(mechanism="rs", gamma=1.5), "gamma must be in the open interval (0, 1)"),
    "gamma tiny": (dict(mechanism="rs_improved", gamma=1e-12), "gamma must be at least 1e-06"),
    # The ledger counts ε in units of 1e-12 (exactly): a smaller ε is refused before any
    # mechanism sees it (GEM's t overflow or combined_gem's split can no longer be reached).
    "epsilon below the unit, gem": (dict(mechanism="mgem", epsilon=1e-308), "below the ledger's unit 1e-12"),
    "epsilon below the unit, combined": (dict(mechanism="combined_gem", epsilon=5e-324), "below the ledger's unit"),
    "epsilon beyond 63 bits": (
        dict(epsilon=1e7),
        "too large for the ledger to count; expected epsilon <= 9223372.036854775807",
    ),
    "c 0": (dict(mechanism="combined_gem", corr_budget_fraction=0.0), "corr_budget_fraction must be in"),
    "c nan": (dict(mechanism="combined_gem", corr_budget_fraction=math.nan), "corr_budget_fraction must be in"),
    "n = 0": (dict(candidates=[]), "no candidates (n = 0)"),
    "unknown item": (dict(candidates=[("it1", 0.5), ("nope", 0.2)]), "unknown item_id 'nope' (candidate #1)"),
    "duplicate item": (dict(candidates=[("it1", 0.5), ("it2", 0.2), ("it1", 0.3)]), "duplicate item_id 'it1'"),
    "too many": (dict(candidates=[(f"it{k}", 0.1) for k in range(26)]), "at most 25"),
    "unknown mechanism": (dict(mechanism="magic"), "unknown mechanism 'magic'; expected one of"),
    "empty user": (dict(user_id=""), "user_id is empty"),
    "huge request_id": (dict(request_id="x" * 300), "request_id is 300 characters long"),
    "NUL in user_id": (dict(user_id="a\x00b"), "user_id contains a NUL character (U+0000) at position 1"),
    "NUL in request_id": (dict(request_id="bad-\x00"), "request_id contains a NUL character (U+0000) at position 4"),
    "rnmh refused": (dict(mechanism="rnmh"), "not differentially private"),
}


@pytest.mark.parametrize("encoding", ["candidates", "columns"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_invalid_argument_and_spends_nothing(
    case: str, encoding: str, client: Client, server: ServerHandle
) -> None:
    over, expected = BAD[case]
    before = server.ledger.totals()
    code, msg = rpc_error(client.stub.Select, _good(encoding, **over), timeout=10)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert expected in msg
    assert server.ledger.totals() == before
    assert server.ledger.lookup(over.get("user_id", "victim"), over.get("request_id", "bad-1")) is None
    # ... and a valid request with that request_id afterwards is NOT a conflict: nothing was stored.
    if case == "epsilon 0":
        assert not client.stub.Select(_good(encoding, request_id=f"bad-after-{encoding}"), timeout=10).replayed


def test_a_nul_in_an_id_is_invalid_argument_for_every_rpc_that_takes_one(client: Client, server: ServerHandle) -> None:
    before = server.ledger.totals()
    for call in (
        lambda: client.budget("nul\x00user"),
        lambda: client.recommend("nul\x00user", ["it0", "it5"], mechanism="rnm", epsilon=0.5),
        lambda: client.recommend("nul-user", ["it0"], mechanism="rnm", epsilon=0.5, request_id="\x00"),
    ):
        code, msg = rpc_error(call)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "contains a NUL character (U+0000) at position" in msg
    assert server.ledger.totals() == before


def test_rnmh_only_with_allow_non_private(artifact: Path, tmp_path: Path) -> None:
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", allow_non_private=True))
    try:
        with Client(f"127.0.0.1:{h.port}") as c:
            assert c.select("u", candidates(), mechanism="rnmh", epsilon=1.0).mechanism == "rnmh"
            assert {m.name: m.allowed for m in c.mechanisms().mechanisms}["rnmh"] is True
    finally:
        h.stop(1)


def test_over_budget_is_resource_exhausted_and_spends_nothing(client: Client, server: ServerHandle) -> None:
    client.select("spender", candidates(), mechanism="rnm", epsilon=BUDGET - 1.0)
    code, msg = rpc_error(client.select, "spender", candidates(), mechanism="rnm", epsilon=1.5, request_id="over")
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "only 1 of 10 remains" in msg
    assert client.budget("spender").spent == pytest.approx(BUDGET - 1.0)
    assert server.ledger.lookup("spender", "over") is None
    r = client.select("spender", candidates(), mechanism="rnm", epsilon=1.0)  # an exact fit still passes
    assert r.budget_remaining == pytest.approx(0.0)
    b = client.budget("spender")
    assert b.spent == pytest.approx(BUDGET) and b.remaining == pytest.approx(0.0)
    assert (b.requests, b.budget) == (2, BUDGET)


def test_mechanism_parameters_reach_the_mechanism_from_the_client_and_the_command_line(
    client: Client, server: ServerHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Each parameter travels in its optional proto field (None: not sent, the mechanism's default)."""
    import json

    import recsvc.service.requests as requests_module
    from recsvc.app.cli import main as recsvc_main

    seen: list[tuple[str, dict]] = []
    # every served selection (k = 1 included) is checked by one of them: Select's by valid_slates
    for check in ("valid_slate", "valid_slates"):
        real = getattr(requests_module, check)

        def spied(name: str, *a: Any, _real: Any = real, **k: Any) -> Any:
            seen.append((name, k))
            return _real(name, *a, **k)

        monkeypatch.setattr(requests_module, check, spied)

    def given(kw: dict[str, object]) -> dict[str, object]:
        return {p: v for p, v in kw.items() if p in ("beta", "gamma", "corr_budget_fraction")}

    client.select(
        "param-user",
        candidates(),
        mechanism="combined_gem",
        epsilon=0.5,
        beta=0.2,
        corr_budget_fraction=0.3,
        gamma=None,
    )
    client.recommend("param-user", ["it0", "it5"], mechanism="rs", epsilon=0.5, num_candidates=5, gamma=0.25)
    argv = [
        "select",
        "--target",
        f"127.0.0.1:{server.port}",
        "--user",
        "param-user",
        "--candidate",
        "it1:0.5",
        "--candidate",
        "it2:0.7",
        "--mechanism",
        "gem",
        "--epsilon",
        "0.5",
        "--beta",
        "0.125",
    ]
    assert recsvc_main(argv) == 0 and json.loads(capsys.readouterr().out)["mechanism"] == "gem"
    assert [(name, given(kw)) for name, kw in seen] == [
        ("combined_gem", {"beta": 0.2, "gamma": None, "corr_budget_fraction": 0.3}),
        ("rs", {"beta": None, "gamma": 0.25, "corr_budget_fraction": None}),
        ("gem", {"beta": 0.125, "gamma": None, "corr_budget_fraction": None}),
    ]
    assert recsvc_main([*argv[:-2], "--beta", "1"]) == 2  # checked by the server, before the ledger
    assert "INVALID_ARGUMENT: beta must be in the open interval (0, 1), got 1.0" in capsys.readouterr().err
    assert server.ledger.user("param-user").spent == pytest.approx(1.5) and len(seen) == 3
    with pytest.raises(
        ValueError,
        match=r"'delta' cannot be sent: RecommendRequest has fields only for "
        r"gamma, beta, corr_budget_fraction, loss_weight$",
    ):
        client.recommend("param-user", ["it0"], mechanism="rs", epsilon=0.5, delta=0.1)


def test_scores_are_clipped_before_selection(client: Client, artifact: Path) -> None:
    """The output distribution matches the exact em probabilities of the CLIPPED scores.

    Raw scores sit far outside [lo, hi]; unclipped, the 1e3 candidate would win every time.
    """
    items = load_artifact(artifact).items
    ids = ["it3", "it7", "it11", "it20", "it33"]
    rows = [items["item_id"].to_list().index(i) for i in ids]
    lo, hi, sens = (items[c].to_numpy()[rows] for c in ("lo", "hi", "sensitivity"))
    raw = np.array([1e3, -5.0, 0.5 * (lo[2] + hi[2]), hi[3] + 1.0, lo[4] - 1.0])
    q = np.clip(raw, lo, hi)
    eps = 3.0
    expected = probabilities("em", q, sens, eps)
    trials = 1500
    reqs = [
        client.select_request(f"clip-{t}", list(zip(ids, raw, strict=False)), mechanism="em", epsilon=eps)
        for t in range(trials)
    ]
    results = client.select_batch(reqs[:750]) + client.select_batch(reqs[750:])
    assert all(r.WhichOneof("outcome") == "response" for r in results)
    counts = np.bincount([ids.index(r.response.item_id) for r in results], minlength=len(ids))
    assert stats.chisquare(counts, expected * trials).pvalue > AUDIT_ALPHA
    unclipped = probabilities("em", raw, sens, eps)
    assert unclipped[0] > 0.999 and counts[0] < 0.9 * trials


@pytest.mark.parametrize(
    ("rho", "threshold", "want"), [(0.5, 0.1, "mgem"), (-0.5, 0.1, "gem"), (0.05, 0.1, "rnm"), (0.5, 0.6, "rnm")]
)
def test_auto_resolves_from_public_population_spearman(rho: float, threshold: float, want: str, tmp_path: Path) -> None:
    art = make_artifact(tmp_path / "a", rho_median=rho)
    h = start(ServerConfig.of(artifacts=art, port=0, ledger=tmp_path / "l.db", auto_threshold=threshold))
    try:
        with Client(f"127.0.0.1:{h.port}") as c:
            assert c.mechanisms().auto_resolves_to == want
            for mech in ("auto", ""):  # empty → the server default, which is auto
                r = c.select("u", candidates(), mechanism=mech, epsilon=0.25)
                assert (r.mechanism, r.epsilon_spent) == (want, 0.25)
            assert c.budget("u").spent == pytest.approx(0.5)  # auto itself costs nothing
    finally:
        h.stop(1)


def test_default_mechanism_and_missing_population_statistics(tmp_path: Path) -> None:
    art = make_artifact(tmp_path / "a", rho_median=None)
    with pytest.raises(ValueError, match=r"population_spearman.median"):
        start(ServerConfig.of(artifacts=art, port=0, ledger=tmp_path / "l.db"))
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        start(ServerConfig.of(artifacts=art, port=0, ledger=tmp_path / "l.db", default_mechanism="nope"))
    h = start(ServerConfig.of(artifacts=art, port=0, ledger=tmp_path / "l.db", default_mechanism="em"))
    try:
        with Client(f"127.0.0.1:{h.port}") as c:
            assert c.select("u", candidates(), epsilon=0.5).mechanism == "em"
            code, msg = rpc_error(c.select, "u", candidates(), mechanism="auto", epsilon=0.5)
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "'auto' is unavailable" in msg
    finally:
        h.stop(1)


def test_select_batch_reports_per_item_status(client: Client, server: ServerHandle) -> None:
    reqs = [
        client.select_request("batch-a", candidates(), mechanism="gem", epsilon=1.0, request_id="b1", beta=0.1),
        client.select_request("batch-a", [("it1", math.nan)], mechanism="rnm", epsilon=1.0, request_id="b2"),
        client.select_request("batch-b", candidates(), mechanism="rnm", epsilon=BUDGET + 1, request_id="b3"),
        client.select_request("batch-b", candidates(), mechanism="combined_gem", epsilon=2.0, request_id="b4"),
    ]
    res = client.select_batch(reqs)
    assert [r.WhichOneof("outcome") for r in res] == ["response", "error", "error", "response"]
    assert (
        res[1].error.code_name == "INVALID_ARGUMENT" and res[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    )
    assert res[2].error.code_name == "RESOURCE_EXHAUSTED"
    assert (res[0].response.mechanism, res[3].response.mechanism) == ("gem", "combined_gem")
    assert client.budget("batch-a").spent == pytest.approx(1.0) and client.budget("batch-b").spent == pytest.approx(2.0)
    # Retrying the whole batch replays the answered items and spends nothing more.
    again = client.select_batch(reqs)
    assert [r.response.item_id for r in (again[0], again[3])] == [res[0].response.item_id, res[3].response.item_id]
    assert again[0].response.replayed and again[3].response.replayed
    assert client.budget("batch-a").spent == pytest.approx(1.0) and client.budget("batch-b").spent == pytest.approx(2.0)


def test_select_batch_too_large_is_refused_whole(artifact: Path, tmp_path: Path) -> None:
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", max_batch=3))
    try:
        with Client(f"127.0.0.1:{h.port}") as c:
            reqs = [c.select_request(f"u{i}", candidates(), mechanism="rnm", epsilon=0.1) for i in range(4)]
            code, msg = rpc_error(c.select_batch, reqs)
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "at most 3" in msg
            assert h.ledger.totals() == {}
    finally:
        h.stop(1)


def test_list_mechanisms_health_and_reflection(client: Client, server: ServerHandle) -> None:
    info = client.mechanisms()
    by_name = {m.name: (m.private, m.allowed) for m in info.mechanisms}
    assert by_name["rnmh"] == (False, False) and by_name["mgem"] == (True, True) and by_name["clm"] == (True, True)
    assert len(by_name) == 15  # every registered mechanism, the one-shot top-k ones included
    assert (info.default_mechanism, info.auto_resolves_to, info.population_spearman_median) == ("auto", "mgem", 0.5)
    assert (info.budget, info.max_candidates, info.max_slate, info.min_candidates, info.catalog_size) == (
        BUDGET,
        25,
        100,
        500,
        40,
    )
    assert client.health() == "SERVING" and client.health("recsvc.v1.PrivateSelection") == "SERVING"
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    services = set(ProtoReflectionDescriptorDatabase(client.channel).get_services())
    assert {"recsvc.v1.PrivateSelection", "grpc.health.v1.Health"} <= services
    code, msg = rpc_error(client.budget, "")
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "user_id is empty" in msg


def test_stop_reports_not_serving(artifact: Path, tmp_path: Path) -> None:
    h = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db"))
    with Client(f"127.0.0.1:{h.port}") as c:
        assert c.health() == "SERVING"
        h.health.enter_graceful_shutdown()
        assert c.health() == "NOT_SERVING"
    h.stop(1)


def test_fingerprint_is_the_sha256_of_the_canonical_request_and_duplicates_are_found_on_reuse(
    server: ServerHandle,
) -> None:
    import hashlib

    from recsvc.service.codec import fingerprint as _fingerprint
    from recsvc.service.errors import InvalidRequest

    # Hashed in pieces (below hashlib's GIL-release size); must stay the plain SHA-256, or
    # retries of requests stored by an older server would be refused as conflicts.
    req = _good("columns")
    req.item_ids.extend(f"pad{k}" for k in range(400))  # > 2 KiB serialised: several pieces
    req.scores.extend([0.5] * 400)
    blob = req.SerializeToString(deterministic=True)
    assert len(blob) > 3 * 2048
    assert _fingerprint(b"select\0", req) == hashlib.sha256(b"select\0" + blob).digest()
    # The duplicate check reuses a per-thread array: stale entries from earlier calls never matter.
    s = server.servicer
    assert s.prepare_select(_good("columns")).fingerprint
    dup = _good("columns")
    dup.item_ids[3] = dup.item_ids[7]
    with pytest.raises(InvalidRequest, match=f"duplicate item_id '{dup.item_ids[7]}'"):
        s.prepare_select(dup)
    assert s.prepare_select(_good("columns", request_id="again")).scores.size == len(candidates(10))


def test_every_path_samples_clipped_scores_with_the_chacha_csprng(
    client: Client, artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Select, SelectBatch and Recommend hand the mechanism scores clipped to [lo, hi] and a
    ChaCha20 generator (never a non-cryptographic one)."""
    from randomgen import ChaCha

    import recsvc.service.requests as requests_module

    seen: list[tuple[np.ndarray, np.ndarray, object]] = []
    real_slate = requests_module.draw_slate

    def spy(v, rng):
        seen.append((np.array(v.q), np.array(v.d), rng))
        return real_slate(v, rng)

    monkeypatch.setattr(requests_module, "draw_slate", spy)
    art = load_artifact(artifact)
    items = art.items
    row = {i: k for k, i in enumerate(items["item_id"].to_list())}
    lo, hi, sens = (items[c].to_numpy() for c in ("lo", "hi", "sensitivity"))
    ids = ["it3", "it7", "it11"]
    raw = np.array([1e3, -5.0, 0.5 * (lo[row["it11"]] + hi[row["it11"]])])
    rows = np.array([row[i] for i in ids])
    client.select("spy-user", list(zip(ids, raw, strict=False)), mechanism="rnm", epsilon=0.5)
    client.select_batch(
        [client.select_request("spy-user", list(zip(ids, raw, strict=False)), mechanism="gem", epsilon=0.5)]
    )
    for q, d, _ in seen:
        assert np.array_equal(q, np.clip(raw, lo[rows], hi[rows])) and np.array_equal(d, sens[rows])
    # Recommend: the server's own SANSA scores of the whole catalog (seen items included),
    # clipped the same way (some lie outside [lo, hi]).
    model = art.model
    history = ["it0", "it5", "it9"]
    x = sp.csr_matrix((np.ones(3), ([0, 0, 0], [model.index[h] for h in history])), shape=(1, len(model.item_ids)))
    scores = model.score(x)[0][[model.index[i] for i in items["item_id"].to_list()]]
    assert ((scores < lo) | (scores > hi)).any()  # clipping matters here
    client.recommend("spy-user", history, mechanism="mgem", epsilon=0.5, num_candidates=10)
    q, d, _ = seen[-1]
    np.testing.assert_allclose(q, np.clip(scores, lo, hi), rtol=1e-12)  # summation order may differ (score_one)
    assert np.array_equal(d, sens)
    assert len(seen) == 3
    for _, _, rng in seen:
        assert isinstance(rng, np.random.Generator) and isinstance(rng.bit_generator, ChaCha)
        assert rng.bit_generator.state["state"]["rounds"] == 20
