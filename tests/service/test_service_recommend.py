"""Recommend is ε-DP end to end over the full catalog; slates and the two-stage path; through
real gRPC channels against in-process servers.

Statistical checks draw from a fixed-seed generator (patched in for the server's CSPRNG, which
is tested in test_service_grpc.py) so they are deterministic; each compares the answers with the
exact distribution of the full-catalog computation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

import recsvc.service.requests as requests_module
import recsvc.service.selection as selection_module
from recsvc.artifact import load_artifact
from recsvc.mechanisms import (
    MECHANISMS,
    charged_epsilon,
    probabilities,
    selection_split,
    slate_probabilities,
    two_stage_probabilities,
)
from recsvc.service.client import Client
from recsvc.service.config import CANDIDATE_MECHANISMS, ServerConfig
from recsvc.service.server import ServerHandle, start
from recsvc.service.testing import AUDIT_ALPHA, N_ITEMS, candidates, make_artifact, rpc_error

HISTORY = ["it0", "it5", "it9"]
FLOOR = 5  # the test servers' --min-candidates
SERVER_OPTIONS = {"budget": 1e6, "min_candidates": FLOOR, "max_slate": 8}  # the module's server (conftest.py)


@pytest.fixture()
def seeded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server draws from one fixed-seed generator (deterministic statistics)."""
    gen = np.random.default_rng(20261124)
    monkeypatch.setattr(selection_module, "thread_csprng", lambda: gen)


def _server(artifact: Path, ledger: Path, **over: object) -> ServerHandle:
    return start(ServerConfig.of(artifacts=artifact, port=0, ledger=ledger, **{**SERVER_OPTIONS, **over}))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Client]]:
    """A 6-item catalog, small enough for exact slate and two-stage distributions."""
    art = make_artifact(tmp_path_factory.mktemp("tiny") / "art", n_items=6, seed=3)
    h = _server(art, tmp_path_factory.mktemp("led") / "l.db", min_candidates=2)
    with Client(f"127.0.0.1:{h.port}", retries=0) as c:
        yield art, c
    h.stop(grace=1)


def _catalog_scores(artifact: Path, history: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(catalog ids, clipped full-catalog SANSA scores of the history, Δ), computed independently."""
    art = load_artifact(artifact)
    model, items = art.model, art.items
    x = sp.csr_matrix(
        (np.ones(len(history)), ([0] * len(history), [model.index[h] for h in history])), shape=(1, len(model.item_ids))
    )
    ids = items["item_id"].to_list()
    raw = model.score(x)[0][[model.index[i] for i in ids]]
    return ids, np.clip(raw, items["lo"].to_numpy(), items["hi"].to_numpy()), items["sensitivity"].to_numpy()


def _chi2_pvalue(counts: Counter, exact: dict, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit of ``counts`` to ``exact`` (outcome → probability); outcomes
    expected fewer than ``min_expected`` times are pooled into one cell."""
    total = sum(counts.values())
    assert set(counts) <= set(exact), "an outcome the exact distribution gives probability 0"
    big = [o for o, p in exact.items() if p * total >= min_expected]
    small = [o for o in exact if o not in set(big)]
    obs = [counts[o] for o in big] + ([sum(counts[o] for o in small)] if small else [])
    exp = [exact[o] * total for o in big] + ([sum(exact[o] for o in small) * total] if small else [])
    exp = np.array(exp) * total / sum(exp)  # exact sums to 1 up to ~1e-12
    return float(stats.chisquare(obs, exp).pvalue)


def test_num_candidates_1_at_small_epsilon_is_near_uniform_over_the_whole_catalog(
    client: Client, artifact: Path, seeded: None
) -> None:
    """A count alone never shrinks the candidates (num_candidates=1 would otherwise reveal the
    private argmax): at ε = 0.01 the answer is near-uniform over all 40 items."""
    ids, q, d = _catalog_scores(artifact, HISTORY)
    argmax = ids[int(np.argmax(q))]
    exact = probabilities("rnm", q, d, 0.01)
    assert 0.5 * np.abs(exact - 1 / N_ITEMS).sum() < 0.01  # exact TV from uniform
    calls = 1000
    answers = Counter(
        client.recommend("uniform-user", HISTORY, mechanism="rnm", epsilon=0.01, num_candidates=1).item_id
        for _ in range(calls)
    )
    freq = np.array([answers[i] for i in ids]) / calls
    tv = 0.5 * np.abs(freq - 1 / N_ITEMS).sum()
    # Sampling noise alone gives TV ≈ 0.08 at 1,000 calls; always the argmax would be 0.975.
    assert tv < 0.15, tv
    assert answers[argmax] / calls < 0.06 and len(answers) == N_ITEMS  # every item came up
    assert sum(answers[h] for h in HISTORY) > 0  # seen items are candidates too
    assert _chi2_pvalue(answers, dict(zip(ids, exact, strict=False))) > AUDIT_ALPHA
    assert client.budget("uniform-user").spent == pytest.approx(calls * 0.01)


def test_answers_follow_the_exact_full_catalog_distribution(tiny: tuple[Path, Client], seeded: None) -> None:
    art, c = tiny
    history = ["it1", "it4"]
    ids, q, d = _catalog_scores(art, history)
    exact = probabilities("mgem", q, d, 4.0)
    assert exact.max() > 0.3  # far from uniform: the test can tell the scores apart
    calls = 600
    answers = Counter(c.recommend("exact-user", history, mechanism="mgem", epsilon=4.0).item_id for _ in range(calls))
    assert _chi2_pvalue(answers, dict(zip(ids, exact, strict=False))) > AUDIT_ALPHA
    assert answers["it1"] + answers["it4"] > 0  # history items are returned too
    # Slates over the catalog: ordered pairs follow the exact peeling distribution.
    exact2 = {tuple(ids[i] for i in s): p for s, p in slate_probabilities("mgem", q, d, 4.0, 2).items()}
    slates = Counter(
        tuple(c.recommend("exact-user", history, mechanism="mgem", epsilon=4.0, k=2).item_ids) for _ in range(calls)
    )
    assert _chi2_pvalue(slates, exact2) > AUDIT_ALPHA


@pytest.mark.parametrize("cand", CANDIDATE_MECHANISMS)
def test_two_stage_follows_its_exact_distribution_and_charges_epsilon_once(
    tiny: tuple[Path, Client], seeded: None, monkeypatch: pytest.MonkeyPatch, cand: str
) -> None:
    art, c = tiny
    history = ["it2"]
    ids, q, d = _catalog_scores(art, history)
    exact = {
        tuple(ids[i] for i in s): p
        for s, p in two_stage_probabilities("rnm", q, d, 3.0, 3, 0.4, k=2, candidate_mechanism=cand).items()
    }
    calls = 400
    user = f"two-user-{cand}"
    got = [
        c.recommend(
            user,
            history,
            mechanism="rnm",
            epsilon=3.0,
            num_candidates=3,
            candidate_fraction=0.4,
            k=2,
            candidate_mechanism=cand,
        )
        for _ in range(calls)
    ]
    assert {r.epsilon_spent for r in got} == {3.0}
    spent = charged_epsilon("rnm", 3.0, 2, m=3, candidate_fraction=0.4, candidate_mechanism=cand)
    stages = selection_split("rnm", 2, m=3, candidate_fraction=0.4, candidate_mechanism=cand).stage_epsilons(3.0)
    assert spent == pytest.approx(0.4 * 3.0 + 0.6 * 3.0 / 2 * 2) and stages == pytest.approx(
        (1.2, 0.9)
    )  # one run, then 2 × ε₂/2
    assert c.budget(user).spent == pytest.approx(calls * spent)  # ε in total, not per stage
    assert _chi2_pvalue(Counter(tuple(r.item_ids) for r in got), exact) > AUDIT_ALPHA
    # m = 0 means the floor (here 2), no candidate_mechanism the server's default, and every stage
    # parameter reaches valid_two_stage.
    seen: list[tuple] = []
    real = requests_module.valid_two_stage

    def spied(*a: Any, **kw: Any) -> Any:
        seen.append(a[4:8])
        return real(*a, **kw)

    monkeypatch.setattr(requests_module, "valid_two_stage", spied)
    r = c.recommend(user, history, mechanism="mgem", epsilon=1.0, candidate_fraction=0.25)
    default = c.mechanisms().default_candidate_mechanism
    assert default == ServerConfig.of(art).selection.default_candidate_mechanism in CANDIDATE_MECHANISMS
    assert seen == [(2, 0.25, 1, default)] and len(r.item_ids) == 1  # (m, fraction, k, candidate mechanism)


def test_bad_two_stage_and_slate_requests_are_refused_and_spend_nothing(
    client: Client, server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[str] = []

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def draw(*a: Any, **kw: Any) -> Any:
            draws.append(a[0])
            return real(*a, **kw)

        return draw

    for fn in ("draw_slate", "draw_two_stage"):
        monkeypatch.setattr(requests_module, fn, counted(getattr(requests_module, fn)))
    rec: dict[str, Any] = {"mechanism": "rnm", "epsilon": 1.0}
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(candidate_fraction=0.0, num_candidates=10), "candidate_fraction must be in the open interval (0, 1)"),
        (dict(candidate_fraction=1.0, num_candidates=10), "candidate_fraction must be in the open interval (0, 1)"),
        (dict(candidate_fraction=float("nan"), num_candidates=10), "candidate_fraction must be in the open interval"),
        (
            dict(candidate_fraction=0.5, num_candidates=FLOOR - 1),
            f"num_candidates={FLOOR - 1} is below this server's floor of {FLOOR} private candidates (--min-candidates)",
        ),
        (
            dict(candidate_fraction=0.5, num_candidates=N_ITEMS + 1),
            f"num_candidates={N_ITEMS + 1} is more than the catalog's {N_ITEMS} items",
        ),
        (
            dict(candidate_fraction=0.5, num_candidates=FLOOR, k=FLOOR + 1),
            f"k={FLOOR + 1} is more than the {FLOOR} private candidates (num_candidates)",
        ),
        (dict(k=9), "k=9 is too large; this server returns at most 8 items per answer (--max-slate)"),
        (dict(candidate_fraction=0.5, num_candidates=2 * FLOOR, k=9), "k=9 is too large"),
        (
            dict(candidate_fraction=0.5, candidate_mechanism="rnm"),
            "candidate_mechanism 'rnm' cannot draw the candidate stage; expected one of oneshot, gumbel, clm",
        ),
        (dict(candidate_fraction=0.5, candidate_mechanism="nope"), "candidate_mechanism 'nope' cannot draw"),
        (dict(candidate_mechanism="clm"), "candidate_mechanism 'clm' needs candidate_fraction (a two-stage Recommend)"),
        (
            dict(loss_weight=0.3),
            "loss_weight is a parameter of clm only, and this request runs 'rnm'; expected mechanism or "
            "candidate_mechanism 'clm', or no loss_weight",
        ),
        (
            dict(candidate_fraction=0.5, candidate_mechanism="gumbel", loss_weight=0.3),
            "loss_weight is a parameter of clm only, and this request runs 'rnm' with candidate_mechanism 'gumbel'",
        ),
        (
            dict(candidate_fraction=0.5, candidate_mechanism="clm", loss_weight=1.5),
            "loss_weight must be in the closed interval [0, 1]",
        ),
        (dict(mechanism="clm", loss_weight=-0.1), "loss_weight must be in the closed interval [0, 1]"),
        (
            dict(mechanism="oneshot", k=7, candidate_fraction=0.5, num_candidates=FLOOR),
            "k=7 is more than the 5 private",
        ),
    ]
    for kwargs, message in cases:
        code, msg = rpc_error(client.recommend, "refused-user", HISTORY, **{**rec, **kwargs})
        assert code is grpc.StatusCode.INVALID_ARGUMENT and message in msg, (kwargs, msg)
    code, msg = rpc_error(client.recommend, "refused-user", ["it1", "ghost"], **rec, k=2)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "unknown item_id 'ghost' in history (position 1)" in msg
    code, msg = rpc_error(client.recommend, "refused-user", ["it1", "it2", "it1"], **rec, k=2)  # a set, as candidates
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "duplicate item_id 'it1' in history (positions 0 and 2)" in msg
    for k, message in ((6, "k=6 is more than the 5 candidates; expected 1 <= k <= 5"), (9, "k=9 is too large")):
        code, msg = rpc_error(client.select, "refused-user", candidates(5), mechanism="rnm", epsilon=1.0, k=k)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and message in msg
    for kwargs, message in (
        (dict(mechanism="clm", k=6), "k=6 is more than the 5 candidates; expected 1 <= k <= 5"),
        (
            dict(mechanism="gumbel", loss_weight=0.5),
            "loss_weight is a parameter of clm only, and this request runs 'gumbel'",
        ),
        (dict(mechanism="clm", loss_weight=2.0, k=2), "loss_weight must be in the closed interval [0, 1]"),
        (dict(mechanism="clm", loss_weight=float("nan")), "loss_weight must be"),
    ):
        code, msg = rpc_error(client.select, "refused-user", candidates(5), epsilon=1.0, **kwargs)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and message in msg, (kwargs, msg)
    [res] = client.select_batch([client.select_request("refused-user", candidates(5), epsilon=1.0, loss_weight=0.5)])
    assert res.error.code_name == "INVALID_ARGUMENT" and "loss_weight is a parameter of clm only" in res.error.message
    [res] = client.select_batch([client.select_request("refused-user", candidates(5), epsilon=1.0, k=6)])
    assert res.error.code_name == "INVALID_ARGUMENT" and "k=6 is more than the 5 candidates" in res.error.message
    assert draws == [] and server.ledger.user("refused-user").requests == 0
    assert client.budget("refused-user").spent == 0.0


def test_slates_are_distinct_replayed_whole_and_charged_once(client: Client, server: ServerHandle) -> None:
    cands = candidates(20)
    r = client.select("slate-user", cands, mechanism="mgem", epsilon=0.8, k=5, request_id="s-1")
    assert len(r.item_ids) == len(set(r.item_ids)) == 5 and set(r.item_ids) <= dict(cands).keys()
    assert r.item_id == r.item_ids[0] and r.epsilon_spent == 0.8 and not r.replayed
    again = client.select("slate-user", cands, mechanism="mgem", epsilon=0.8, k=5, request_id="s-1")
    assert (list(again.item_ids), again.replayed, again.budget_remaining) == (
        list(r.item_ids),
        True,
        r.budget_remaining,
    )
    code, _ = rpc_error(client.select, "slate-user", cands, mechanism="mgem", epsilon=0.8, k=4, request_id="s-1")
    assert code is grpc.StatusCode.ALREADY_EXISTS  # k is part of the request: another k is another request
    rec = client.recommend("slate-user", HISTORY, mechanism="rnm", epsilon=0.5, k=8, request_id="s-2")
    assert len(set(rec.item_ids)) == 8 and rec.item_id == rec.item_ids[0]
    assert list(
        client.recommend("slate-user", HISTORY, mechanism="rnm", epsilon=0.5, k=8, request_id="s-2").item_ids
    ) == list(rec.item_ids)
    [b] = client.select_batch([client.select_request("slate-user", cands, mechanism="rnm", epsilon=0.2, k=3)])
    assert len(set(b.response.item_ids)) == 3
    assert client.budget("slate-user").spent == pytest.approx(0.8 + 0.5 + 0.2)  # one ε per slate
    assert server.ledger.user("slate-user").requests == 3


def test_the_candidate_mechanisms_are_the_registrys_one_shot_ones() -> None:
    assert set(CANDIDATE_MECHANISMS) == {n for n, m in MECHANISMS.items() if m.one_shot}


def test_the_servers_default_candidate_mechanism_is_reported_and_runs_with_its_loss_weight(
    tiny: tuple[Path, Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art, _ = tiny
    seen: list[tuple] = []
    real = requests_module.valid_two_stage

    def spied(*a: Any, **kw: Any) -> Any:
        seen.append((a[7], kw.get("loss_weight")))
        return real(*a, **kw)

    monkeypatch.setattr(requests_module, "valid_two_stage", spied)
    h = _server(art, tmp_path / "l.db", min_candidates=2, default_candidate_mechanism="clm")
    try:
        with Client(f"127.0.0.1:{h.port}", retries=0) as c:
            assert c.mechanisms().default_candidate_mechanism == "clm"
            r = c.recommend("lw-user", ["it2"], mechanism="rnm", epsilon=2.0, candidate_fraction=0.5, loss_weight=0.2)
            assert r.epsilon_spent == 2.0 and c.budget("lw-user").spent == 2.0
            s = c.select(
                "lw-user", [(f"it{i}", i / 6) for i in range(6)], mechanism="clm", epsilon=1.0, k=3, loss_weight=0.0
            )
            assert len(set(s.item_ids)) == 3 and s.epsilon_spent == 1.0
    finally:
        h.stop(grace=1)
    assert seen == [("clm", 0.2)]
