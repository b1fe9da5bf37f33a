"""`auto` with a policy table: resolved per request from (ε, k) by the documented rule,
never from the request's scores; the response and ListMechanisms say what it resolved to; a bad
table refuses the start; no table keeps the sign rule with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from recsvc.app.cli import main
from recsvc.artifact import ArtifactError, load_artifact
from recsvc.service.client import Client
from recsvc.service.config import Limits, SelectorConfig, ServerConfig
from recsvc.service.selection import Selector
from recsvc.service.server import start
from recsvc.service.testing import N_ITEMS, add_policy, candidates, item_ids, make_artifact

# k = 1: rnm at ε 0.1, gem at 1, krr at 10; k = 5: mgem at 0.1 and 10, em at 1. rho_median says
# mgem: the sign rule would pick mgem everywhere.
TABLE = [
    (0.1, 1, "rnm", 0.20, 1),
    (0.1, 1, "krr", 0.30, 2),
    (1.0, 1, "gem", 0.10, 1),
    (1.0, 1, "krr", 0.20, 2),
    (10.0, 1, "krr", 0.01, 1),
    (10.0, 1, "rnm", 0.05, 2),
    (0.1, 5, "mgem", 0.25, 1),
    (1.0, 5, "em", 0.15, 1),
    (10.0, 5, "mgem", 0.05, 1),
]
# (ε, k) → the grid point's winner: nearest k in log k, then nearest ε in log ε, ties to the lower point.
EXPECTED = [
    (0.001, 1, "rnm"),
    (0.1, 1, "rnm"),
    (0.3162, 1, "rnm"),
    (0.3163, 1, "gem"),
    (1.0, 1, "gem"),
    (3.1622, 1, "gem"),
    (3.1623, 1, "krr"),
    (10.0, 1, "krr"),
    (1e6, 1, "krr"),
    (2.0, 2, "gem"),
    (2.0, 3, "em"),
    (0.2, 5, "mgem"),
    (0.4, 7, "em"),
    (50.0, 40, "mgem"),
]


@pytest.fixture(scope="module")
def table_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return add_policy(make_artifact(tmp_path_factory.mktemp("auto") / "art", rho_median=0.5), TABLE)


@pytest.fixture(scope="module")
def selector(table_artifact: Path) -> Selector:
    return Selector(load_artifact(table_artifact), SelectorConfig())


def _select(selector: Selector, eps: float, scores: np.ndarray, mechanism: str = "auto"):
    ids = item_ids()[: scores.size]
    return selector.prepare_select("u", "r", mechanism, eps, {}, ids, scores, lambda: b"")


@pytest.mark.parametrize("eps, k, want", EXPECTED)
def test_auto_resolves_per_request_from_epsilon_and_k(selector: Selector, eps: float, k: int, want: str) -> None:
    assert selector.mechanism_name("auto", eps, k, candidates=50) == want
    if k == 1:
        for name in ("auto", ""):  # empty: the server default, which is auto
            assert _select(selector, eps, np.linspace(0, 1, 10), name).mechanism == want


def test_the_resolution_never_reads_the_scores(selector: Selector) -> None:
    """Scores that would flip the sign rule, reversed, constant or far outside the clip ranges:
    the resolved mechanism depends on ε only."""
    rng = np.random.default_rng(0)
    lo, hi = selector.catalog.lo[:N_ITEMS], selector.catalog.hi[:N_ITEMS]
    vectors = [rng.uniform(-5, 5, N_ITEMS) for _ in range(10)]
    vectors += [hi - lo, lo - hi, np.zeros(N_ITEMS), np.full(N_ITEMS, 1e9), selector.catalog.sensitivity[:N_ITEMS]]
    for eps, k, want in EXPECTED:
        if k != 1:
            continue
        got = {_select(selector, eps, v[:n]).mechanism for v in vectors for n in (2, 17, N_ITEMS)}
        assert got == {want}, eps


def test_grpc_response_and_list_mechanisms_say_what_auto_resolved_to(table_artifact: Path, tmp_path: Path) -> None:
    h = start(ServerConfig.of(artifacts=table_artifact, port=0, ledger=tmp_path / "l.db"))
    try:
        with Client(f"127.0.0.1:{h.port}") as c:
            info = c.mechanisms()
            assert info.auto_resolves_to == ""  # per request: see auto_policy
            got = [(e.k, e.epsilon, e.mechanism, e.expected_mse) for e in info.auto_policy]
            assert got == sorted((k, e, m, v) for e, k, m, v, r in TABLE if r == 1)
            for eps, want in ((0.1, "rnm"), (1.5, "gem"), (8.0, "krr")):
                r = c.select("u", candidates(), mechanism="auto", epsilon=eps)
                assert (r.mechanism, r.epsilon_spent) == (want, eps)
            assert c.budget("u").spent == pytest.approx(9.6)
    finally:
        h.stop(1)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([(1.0, 1, "magic", 0.1, 1)], r"policy.parquet: unknown mechanism\(s\) 'magic' \(made by another version\?\)"),
        ([], r"policy.parquet: .*the grid is empty"),
    ],
)
def test_a_table_this_version_cannot_use_refuses_the_start(
    rows, message, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = add_policy(make_artifact(tmp_path / "a"), rows, checked=False)
    with pytest.raises(ArtifactError, match=message):
        Selector(load_artifact(art), SelectorConfig())
    monkeypatch.setattr("signal.signal", lambda *a: None)  # in-process `serve` must not replace pytest's handlers
    assert main(["serve", "--artifacts", str(art), "--ledger", str(tmp_path / "l.db"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recsvc serve: error: ") and "policy.parquet" in err[0], err
    assert not (tmp_path / "l.db").exists()


def test_no_table_keeps_the_sign_rule_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    art = make_artifact(tmp_path / "a", rho_median=-0.5)
    with caplog.at_level(logging.WARNING, logger="recsvc.service"):
        s = Selector(load_artifact(art), SelectorConfig())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "has no policy.parquet: `auto` falls back to the sign" in warnings[0].getMessage()
    assert "(→ gem for every ε)" in warnings[0].getMessage()
    assert "recsvc policy --artifacts" in warnings[0].getMessage()
    assert {s.mechanism_name("auto", e) for e in (0.01, 1.0, 16.0)} == {"gem"}
    assert s.auto_table is None and s.auto_choice == "gem"


INFO = {
    "epsilons": [0.1, 1.0, 10.0],
    "ks": [1, 5],
    "mechanisms": ["rnm", "krr", "gem", "mgem", "em"],
    "users": 9,
    "candidates": 12,
    "trials": 5,
    "seed": 0,
    "params": {"gamma": 0.05},
    "utility": "test",
}


def test_larger_candidate_sets_than_the_tables_use_the_sign_rule_and_params_follow_the_table(tmp_path: Path) -> None:
    """The table holds for candidate sets up to its population's (12 here): a Select with more
    candidates, or Recommend over the 40-item catalog, resolves by the sign rule (mgem: ρ̄ = 0.5).
    Where the table applies, its mechanism parameters fill the ones the request leaves unset."""
    art = add_policy(
        make_artifact(tmp_path / "a", rho_median=0.5), [(1.0, 1, "rs", 0.1, 1), (1.0, 1, "gem", 0.2, 2)], info=INFO
    )
    s = Selector(load_artifact(art), SelectorConfig(limits=Limits(min_candidates=5)))
    ids = item_ids()
    small = s.prepare_select("u", "r", "auto", 1.0, {"gamma": None}, ids[:12], np.linspace(0, 1, 12), lambda: b"")
    assert (small.mechanism, small.params["gamma"]) == ("rs", 0.05)
    mine = s.prepare_select("u", "r", "auto", 1.0, {"gamma": 0.2}, ids[:12], np.linspace(0, 1, 12), lambda: b"")
    assert mine.params["gamma"] == 0.2  # the request's own value wins
    large = s.prepare_select("u", "r", "auto", 1.0, {"gamma": None}, ids[:13], np.linspace(0, 1, 13), lambda: b"")
    assert (large.mechanism, large.params["gamma"]) == ("mgem", None)
    full = s.prepare_recommend("u", "r", "auto", 1.0, {}, ["it1"], 0, lambda: b"")
    assert full.mechanism == "mgem" and full.scores.size == N_ITEMS
    staged = s.prepare_recommend("u", "r", "auto", 2.0, {}, ["it1"], 10, lambda: b"", candidate_fraction=0.5)
    assert staged.mechanism == "rs"  # selects among m = 10 ≤ 12 at ε = 1: the table's choice
