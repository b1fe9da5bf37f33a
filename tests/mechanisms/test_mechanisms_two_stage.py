"""Two-stage selection (select_two_stage): a private top-m at candidate_fraction·ε, then a slate
with the rest. Exact DP audit at the TOTAL ε (the composed map the service charges) on every box
vertex (n ≤ 6, m ≤ 3), exact probabilities vs Monte Carlo, full support over the catalog, and bad
input that draws nothing."""

import math

import numpy as np
import pytest

from recsvc.mechanisms import (
    MECHANISMS,
    AuditKind,
    MechanismInputError,
    NonPrivateMechanismError,
    charged_epsilon,
    select_slate,
    select_two_stage,
    slate_probabilities,
    two_stage_log_probabilities,
    two_stage_probabilities,
)
from recsvc.mechanisms.testing import TOL, audited, chisquare_pvalue, max_log_ratio, neighbour_vertices

ALPHA = 1e-3
EXACT = audited(AuditKind.EXACT)
SENS = np.array([0.05, 1.0, 3.0, 0.4, 1.7, 0.2])
Q = np.array([0.3, 1.0, -0.5, 0.8, 0.1])
D = np.array([0.5, 2.0, 0.2, 1.0, 0.7])


def _worst_loss(name, cand, n, count, m, k, fraction, eps=1.0):
    """max over neighbours q' (box vertices) and ordered k-slates of |log P(s|q) − log P(s|q')|."""
    q = np.random.default_rng(n).normal(size=n) * 2
    d = SENS[:n]
    base = two_stage_log_probabilities(name, q, d, eps, m, fraction, k, cand)
    assert len(base) == math.perm(n, k) and all(np.isfinite(v) for v in base.values())  # full support
    worst = 0.0
    for q2 in neighbour_vertices(q, d, count, seed=n):
        worst = max(worst, max_log_ratio(base, two_stage_log_probabilities(name, q2, d, eps, m, fraction, k, cand)))
    return worst


@pytest.mark.parametrize("name", EXACT)
def test_exact_two_stage_audit_every_mechanism(name):
    """Each exactly audited mechanism as both stages: n = 4, m = 2, k = 1, 30 box vertices."""
    bound = charged_epsilon(name, 1.0, 1, m=2, candidate_fraction=0.5, candidate_mechanism=name)
    assert bound == 1.0 and _worst_loss(name, name, 4, 30, 2, 1, 0.5) <= bound + TOL


@pytest.mark.parametrize("name,cand", [("rnm", "rnm"), ("krr", "krr"), ("combined_gem", "em"), ("em", "krr")])
@pytest.mark.parametrize("n,count,m,k,fraction", [(4, None, 3, 2, 0.3), (6, 8, 3, 1, 0.5), (6, 6, 3, 2, 0.7)])
def test_exact_two_stage_audit_at_total_epsilon(name, cand, n, count, m, k, fraction):
    """Every box vertex at n = 4 (m = 3, k = 2); random vertices at n = 6."""
    assert _worst_loss(name, cand, n, count, m, k, fraction) <= 1.0 + TOL


def test_two_stage_loss_exceeds_each_stage_so_the_charge_is_the_total():
    """krr in both stages at ε₁ = ε₂ = ε/2: the loss exceeds either stage's budget."""
    assert _worst_loss("krr", "krr", 4, None, 2, 1, 0.5) > 0.5 + 0.01


@pytest.mark.parametrize("name,cand,m,k", [("gem", "rnm", 3, 2), ("rnm", "em", 2, 1), ("krr", "combined_gem", 3, 2)])
def test_two_stage_probabilities_match_monte_carlo(name, cand, m, k):
    p = two_stage_probabilities(name, Q, D, 2.0, m, 0.4, k, cand)
    assert sum(p.values()) == pytest.approx(1.0, abs=1e-12)
    outcomes = list(p)
    index = {s: i for i, s in enumerate(outcomes)}
    rng = np.random.default_rng(5)
    counts = np.zeros(len(outcomes))
    for _ in range(3_000):
        counts[index[tuple(select_two_stage(name, Q, D, 2.0, m, 0.4, k, rng, cand).tolist())]] += 1
    assert chisquare_pvalue(counts, np.array([p[s] for s in outcomes])) > ALPHA


def test_two_stage_with_m_equal_n_is_a_slate_at_the_second_budget():
    """m = n: every item is a candidate, so the result is select_slate at ε₂ = (1 − f)ε."""
    two = two_stage_probabilities("em", Q, D, 2.0, 5, 0.25, 2)
    one = slate_probabilities("em", Q, D, 1.5, 2)
    assert two.keys() == one.keys()
    np.testing.assert_allclose([two[s] for s in one], list(one.values()), rtol=1e-10)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_two_stage_returns_distinct_catalog_indices(name):
    rng = np.random.default_rng(2)
    for _ in range(10):
        s = select_two_stage(name, Q, D, 1.0, 3, 0.5, 2, rng, name, allow_non_private=True)
        assert (
            s.dtype == np.int64 and s.shape == (2,) and len(set(s.tolist())) == 2 and set(s.tolist()) <= set(range(5))
        )
    assert len(select_two_stage("rnm", Q, D, 1.0, 2, 0.5)) == 1  # default k = 1, CSPRNG


def test_two_stage_at_large_epsilon_is_the_top_k():
    assert select_two_stage("rnm", Q, D, 2000.0, 3, 0.5, 2, np.random.default_rng(0)).tolist() == [1, 3]


BAD = [
    (dict(candidate_fraction=0.0), r"candidate_fraction must be in the open interval \(0, 1\)"),
    (dict(candidate_fraction=1.0), r"candidate_fraction must be in the open interval \(0, 1\)"),
    (dict(candidate_fraction=-0.2), r"open interval \(0, 1\)"),
    (dict(candidate_fraction=1.5), r"open interval \(0, 1\)"),
    (dict(candidate_fraction=float("nan")), r"open interval \(0, 1\)"),
    (dict(candidate_fraction=True), r"candidate_fraction must be a real number in \(0, 1\)"),
    (dict(candidate_fraction="0.5"), r"candidate_fraction must be a real number"),
    (dict(m=0), r"m = 0 is out of range; expected an integer with 1 ≤ m ≤ 5"),
    (
        dict(m=6),
        r"m = 6 is out of range; expected an integer with 1 ≤ m ≤ 5 \(the number of candidates in the catalog\)",
    ),
    (dict(m=2.0), r"m must be an integer"),
    (dict(k=4), r"k = 4 is out of range; expected an integer with 1 ≤ k ≤ 3 \(m, the number of private candidates\)"),
    (dict(k=0), r"k = 0 is out of range"),
    (dict(epsilon=-1.0), "epsilon must be a positive"),
    (dict(epsilon=1e-323), "rounds to 0"),
    (dict(name="nope"), "unknown mechanism 'nope'"),
    (dict(cand="nope"), "unknown mechanism 'nope'"),
    (dict(params=dict(beta=2.0)), "beta"),
    (dict(sensitivities=[1.0, -1.0, 1.0, 1.0, 1.0]), "sensitivities must be > 0"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_input_is_a_clear_error_and_draws_nothing(change, match):
    a = dict(
        name="gem", cand="rnm", scores=Q, sensitivities=D, epsilon=1.0, m=3, candidate_fraction=0.5, k=2, params={}
    )
    a |= change
    rng = np.random.default_rng(4)
    before = rng.bit_generator.state
    with pytest.raises(MechanismInputError, match=match):
        select_two_stage(
            a["name"],
            a["scores"],
            a["sensitivities"],
            a["epsilon"],
            a["m"],
            a["candidate_fraction"],
            a["k"],
            rng,
            a["cand"],
            **a["params"],
        )
    assert rng.bit_generator.state == before


def test_stage_two_data_checks_run_before_stage_one_draws():
    """gem refuses these scores (t·Δ overflows) while rnm takes them: the call fails with
    nothing drawn, not after the candidate stage spent randomness."""
    q = np.array([1e307, -1e307, 0.0, 1.0])
    d = np.array([1e-3, 1.0, 1.0, 1.0])
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert len(select_slate("rnm", q, d, 1e-3, 2, np.random.default_rng(0))) == 2
    with pytest.raises(MechanismInputError, match="too small for the GEM family"):
        select_two_stage("gem", q, d, 1e-3, 2, 0.5, 1, rng, "rnm")
    assert rng.bit_generator.state == before


def test_non_private_stages_need_opt_in_and_exact_needs_exact_mechanisms():
    for name, cand in (("rnmh", "rnm"), ("rnm", "rnmh")):
        with pytest.raises(NonPrivateMechanismError):
            select_two_stage(name, Q, D, 1.0, 3, 0.5, 1, np.random.default_rng(0), cand)
        with pytest.raises(NotImplementedError, match="no exact selection probabilities"):
            two_stage_probabilities(name, Q, D, 1.0, 3, 0.5, 1, cand)
    with pytest.raises(NotImplementedError, match="'rs'"):
        two_stage_probabilities("rnm", Q, D, 1.0, 3, 0.5, 1, "rs")
    with pytest.raises(MechanismInputError, match="exact enumeration is for small inputs"):
        two_stage_probabilities("rnm", np.zeros(40), np.ones(40), 1.0, 6, 0.5, 1)
