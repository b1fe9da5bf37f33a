"""Privacy proofs by audit: exact worst-case neighbour checks, a statistical audit with a
controlled false-positive rate (and demonstrated power), and the paper's counterexamples."""

import math

import numpy as np
import pytest

from recsvc.mechanisms import MECHANISMS, select_batch

from mechanisms_audit import SENS, TINY, box_vertex_pairs, max_loss, paper_pairs, statistical_audit, vertex_pairs
from mechanisms_reference import noisy_max_probabilities_quad, random_stopping_probabilities_quad

TOL = 1e-9  # numerical tolerance on exact log-probabilities
EXACT_PRIVATE = [n for n, m in MECHANISMS.items() if m.exact and m.private]


@pytest.mark.parametrize("name", EXACT_PRIVATE)
@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_exact_dp_audit_on_every_box_vertex(name, epsilon):
    worst = max_loss(name, box_vertex_pairs(), epsilon)
    assert worst <= epsilon + TOL, f"{name}: privacy loss {worst} > ε = {epsilon}"
    if name in ("rnm", "rnm_laplace", "pf", "em", "krr"):
        assert worst > 0.4 * epsilon  # the audit does reach near-worst cases


@pytest.mark.parametrize("name", EXACT_PRIVATE)
def test_exact_dp_audit_n10_random_vertices_and_interior(name):
    rng = np.random.default_rng(3)
    d = SENS
    pairs = []
    for _ in range(60):
        q = rng.normal(size=10)
        delta = rng.choice([-1.0, 0.0, 1.0], size=10) if rng.random() < 0.7 else rng.uniform(-1, 1, 10)
        pairs.append((q, q + delta * d, d))
    for eps, c in ((0.3, 0.6), (3.0, 0.25)):
        assert max_loss(name, pairs, eps, corr_budget_fraction=c, beta=0.2) <= eps + TOL


@pytest.mark.parametrize("kind", ["rs", "rs_improved"])
@pytest.mark.parametrize("gamma", [0.008, 0.3])
def test_random_stopping_exact_audit_by_quadrature(kind, gamma):
    """rs / rs_improved have a 1-D integral form (mechanisms_reference.random_stopping_probabilities_quad)."""
    eps = 1.0
    pairs = list(vertex_pairs(2, 0)) + list(vertex_pairs(3, 1))[::3] + list(paper_pairs())[:3]
    worst = 0.0
    for q, q2, d in pairs:
        a = random_stopping_probabilities_quad(q, d, eps, gamma, kind)
        b = random_stopping_probabilities_quad(q2, d, eps, gamma, kind)
        worst = max(worst, float(np.abs(np.log(a) - np.log(b)).max()))
    assert worst <= eps + 1e-6
    assert worst > 0.1 * eps


@pytest.mark.parametrize("name", ["rs", "rs_improved"])
def test_statistical_audit_random_stopping(name):
    d = np.array([0.1, 2.0])
    pairs = [(np.zeros(2), s * d, d) for s in (np.array([1.0, -1.0]), np.array([-1.0, 1.0]), np.array([1.0, 0.0]))]
    pairs += [list(paper_pairs())[0]]
    eps = 1.0
    # certified lower bound on the privacy loss must not exceed ε (false-positive rate ≤ ALPHA)
    assert statistical_audit(name, pairs, eps, 100, gamma=0.05) <= eps


def test_statistical_audit_has_power_on_rnmh():
    """The same audit DOES flag rnmh on the §IV-A counterexample (loss certified > 5ε)."""
    pair = list(paper_pairs())[0]
    assert statistical_audit("rnmh", [pair], 1.0, 200) > 5.0


def test_counterexample_section_iv_a_rnmh():
    """§IV-A: Δ_1 ≈ 0, q_1 = 0; q_2 = ½ vs −½ (Δ_2 = 1). P(1) ≈ 0 on D, 1 − e^{−ε/4} on D′."""
    eps = 1.0
    q, q2, d = list(paper_pairs())[0]
    d = np.array([0.05, 1.0])  # a resolvable Δ_1; the closed form → ∞ as Δ_1 → 0
    p = noisy_max_probabilities_quad(q, 2 * d / eps, "exponential")
    p2 = noisy_max_probabilities_quad(q2, 2 * d / eps, "exponential")
    r1, r2 = eps / (2 * d[0]), eps / (2 * d[1])  # closed form for two candidates
    assert p[0] == pytest.approx(math.exp(-r1 * 0.5) * r2 / (r1 + r2), rel=1e-6, abs=0)
    assert p2[0] == pytest.approx(1 - math.exp(-0.5 * r2) * r1 / (r1 + r2), rel=1e-6, abs=0)  # → 1 − e^{−ε/4}
    assert math.log(p2[0] / p[0]) > 5 * eps  # ≫ ε: not ε-DP (and unbounded as Δ_1 → 0)
    x = select_batch("rnmh", np.stack([q, q2]), np.array([TINY, 1.0]), eps, 50_000, 1, allow_non_private=True)
    assert (x[0] == 0).sum() == 0 and abs((x[1] == 0).mean() - (1 - math.exp(-eps / 4))) < 0.01


@pytest.mark.parametrize("k", [3, 5])
def test_counterexample_appendix_a_heterogeneous_laplace(k):
    """Appendix A: RNM with heterogeneous Laplace(Δ_a/ε) noise is no better than (k−1)ε-DP;
    our rnm_laplace (homogeneous 2Δmax/ε) on the same neighbours stays within ε."""
    eps = 1.0
    d = np.r_[1e-4, np.ones(k - 1)]
    q1, q2 = np.zeros(k), np.r_[0.0, np.ones(k - 1)]
    p1 = noisy_max_probabilities_quad(q1, d / eps, "laplace")
    p2 = noisy_max_probabilities_quad(q2, d / eps, "laplace")
    loss = math.log(p1[0] / p2[0])
    assert loss == pytest.approx((k - 1) * eps, rel=0.01) and loss > 1.5 * eps
    h1 = noisy_max_probabilities_quad(q1, np.full(k, 2 * d.max() / eps), "laplace")
    h2 = noisy_max_probabilities_quad(q2, np.full(k, 2 * d.max() / eps), "laplace")
    assert np.abs(np.log(h1) - np.log(h2)).max() <= eps + 1e-7
