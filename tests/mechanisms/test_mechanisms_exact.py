"""Exact probabilities: closed forms, quadrature accuracy at n = 500, GEM's fast q', and Monte
Carlo goodness of fit (χ² at a stated α with fixed seeds) for every mechanism."""

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from recsvc.mechanisms import MECHANISMS, log_probabilities, probabilities, select, select_batch
from recsvc.mechanisms.gem import gem_t, q_prime, q_prime_naive, report_correlation_bit
from recsvc.mechanisms.testing import REFERENCE, chisquare_pvalue, noisy_max_probabilities_quad

ALPHA = 1e-3  # per goodness-of-fit test; seeds are fixed, so outcomes are deterministic
EXACT = [n for n, m in MECHANISMS.items() if m.exact]
Q6 = np.array([0.0, 0.4, 1.0, 0.9, -0.3, 0.6])
D6 = np.array([0.3, 1.5, 0.8, 0.2, 1.0, 2.0])
D_POS = np.array([0.3, 0.9, 2.0, 1.5, 0.2, 1.0])  # same order as Q6: Spearman +1
D_NEG = 2.3 - D_POS  # Spearman −1


def _user(n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=n), rng.uniform(0.05, 2.0, size=n)


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("epsilon", [1e-3, 1.0, 16.0, 1e4])
def test_probabilities_sum_to_one_at_n500(name, epsilon):
    q, d = _user(500, 0)
    logp = log_probabilities(name, q, d, epsilon)
    p = np.exp(logp)
    assert logp.shape == (500,) and np.all(np.isfinite(logp)), "log space keeps every probability"
    assert abs(p.sum() - 1.0) < 1e-10
    if name != "random":
        assert p.argmax() in np.argsort(q)[-60:] or name in ("gem", "mgem", "combined_gem")


@pytest.mark.parametrize("name", EXACT)
def test_single_candidate_has_probability_one(name):
    np.testing.assert_allclose(probabilities(name, [0.3], [1.0], 1.0), [1.0], rtol=1e-12)


def test_rnm_matches_two_candidate_formula_and_uniform_ties():
    # paper §V-A: P(lower) = ½ exp(−ε (q2 − q1) / 2Δ)
    for eps in (0.1, 1.0, 7.0):
        p = probabilities("rnm", [0.0, 1.0], [1.0, 0.5], eps)
        assert p[0] == pytest.approx(0.5 * math.exp(-eps / 2), rel=1e-12)
    np.testing.assert_allclose(probabilities("rnm", np.full(500, 0.7), np.ones(500), 3.0), 1 / 500, rtol=1e-10)


@pytest.mark.parametrize("epsilon", [0.3, 2.0, 9.0])
def test_rnm_quadrature_matches_adaptive_reference(epsilon):
    q, d = _user(7, 3)
    ref = noisy_max_probabilities_quad(q, np.full(7, 2 * d.max() / epsilon), "exponential")
    np.testing.assert_allclose(probabilities("rnm", q, d, epsilon), ref, rtol=1e-7, atol=1e-15)


def _laplace_case(n, kind, seed=0):
    """Score shapes that stress the segment quadrature of rnm_laplace."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        q = rng.normal(size=n)
    elif kind == "ties":
        q = np.round(rng.normal(size=n), 1)
    elif kind == "cluster":  # one wide top segment above a tight cluster
        q = np.r_[rng.normal(size=n - 1) * 1e-3, 5.0]
    else:  # two tight clusters far apart
        q = np.r_[rng.normal(size=n // 2) * 0.01, 3.0 + rng.normal(size=n - n // 2) * 0.01]
    return q, rng.uniform(0.05, 2.0, size=n)


@pytest.mark.parametrize("n", [2, 3, 10, 60, 200])
def test_rnm_laplace_sums_to_one_across_n_and_epsilon(n):
    for kind in ("normal", "ties", "cluster", "two"):
        q, d = _laplace_case(n, kind)
        for eps in (1e-3, 0.1, 1.0, 16.0, 300.0, 1e4):
            logp = log_probabilities("rnm_laplace", q, d, eps)
            assert np.all(np.isfinite(logp)), (kind, eps)
            assert abs(np.exp(logp).sum() - 1.0) < 1e-10, (kind, eps)
    q, d = _laplace_case(500, "cluster")
    for eps in (1.0, 1e4):
        assert abs(probabilities("rnm_laplace", q, d, eps).sum() - 1.0) < 1e-10


def test_rnm_laplace_two_candidate_closed_form():
    # L1 − L2 (i.i.d. Laplace(1)) has density ¼(1 + |t|)e^{−|t|}: P(L1 − L2 > c) = ¼(2 + c)e^{−c}, c ≥ 0
    for eps in (1e-3, 0.1, 1.0, 7.0, 50.0, 1e4):
        c = eps * 1.0 / (2 * 1.0)  # gap 1, Δmax = 1
        logp = log_probabilities("rnm_laplace", [0.0, 1.0], [1.0, 0.5], eps)
        assert logp[0] == pytest.approx(math.log(2 + c) - c - math.log(4), rel=1e-12, abs=1e-13)
        assert logp[1] == pytest.approx(math.log1p(-(2 + c) * math.exp(-c) / 4), rel=1e-12, abs=1e-13)


@pytest.mark.parametrize("epsilon", [1.0, 1e4])
def test_rnm_laplace_ties_split_evenly(epsilon):
    logp = log_probabilities("rnm_laplace", [1.0, 0.5, 1.0, 0.2, 1.0], np.ones(5), epsilon)
    p = np.exp(logp)
    np.testing.assert_allclose(p[[0, 2, 4]], p[0], rtol=1e-12)
    assert logp[0] > logp[1] > logp[3] > -np.inf  # the losers keep a finite log even at ε = 1e4
    if epsilon > 100:
        np.testing.assert_allclose(p[[0, 2, 4]], 1 / 3, rtol=1e-12)
    np.testing.assert_allclose(probabilities("rnm_laplace", np.full(500, 0.7), np.ones(500), 3.0), 1 / 500, rtol=1e-10)


def test_rnm_laplace_extreme_spread_concentrates_on_argmax():
    # u spans ~1e302 noise scales: every piece boundary must still be hit exactly
    logp = log_probabilities("rnm_laplace", [0.0, 1.0, 1.0 - 1e-9, 0.5], np.full(4, 1e-6), 1e300)
    assert np.all(np.isfinite(logp)) and logp[1] == pytest.approx(0.0, abs=1e-12)
    assert logp[0] < logp[3] < logp[2] < -1e290


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("epsilon", [0.05, 0.7, 4.0, 20.0])
def test_rnm_laplace_matches_adaptive_quadrature(n, epsilon):
    q, d = Q6[:n].copy(), D6[:n]
    if n == 5:
        q[4] = q[2]  # a tie
    ref = noisy_max_probabilities_quad(q, np.full(n, 2 * d.max() / epsilon), "laplace", width=80.0)
    np.testing.assert_allclose(probabilities("rnm_laplace", q, d, epsilon), ref, rtol=1e-9, atol=0)


def test_rnm_laplace_quadrature_converged(monkeypatch):
    """Refining the pieces (24 nodes, 3× smaller log-variation, larger cut-off) changes no log P."""
    from recsvc.mechanisms import exact

    cases = [(_laplace_case(200, kind), eps) for kind in ("normal", "cluster", "two") for eps in (0.1, 16.0, 1e4)]
    base = [log_probabilities("rnm_laplace", q, d, eps) for (q, d), eps in cases]
    monkeypatch.setattr(exact, "_LAP_NODES", ((np.inf, 24),))
    monkeypatch.setattr(exact, "_LAP_VAR", 3.0)
    monkeypatch.setattr(exact, "_LAP_CUT", 60.0)
    monkeypatch.setattr(exact, "_LAP_FAR", 30.0)
    for ((q, d), eps), b in zip(cases, base, strict=False):
        fine = log_probabilities("rnm_laplace", q, d, eps)
        # |log P| reaches ~1e4 at ε = 1e4: compare relative to it (1e-12 relative in P elsewhere)
        np.testing.assert_allclose(b, fine, rtol=1e-14, atol=1e-12 * max(1.0, np.abs(fine).max()))


def test_em_and_krr_closed_forms():
    p = probabilities("em", Q6, D6, 1.3)
    np.testing.assert_allclose(p[2] / p[4], math.exp(1.3 * 1.3 / (2 * 2.0)), rtol=1e-12)
    p = probabilities("krr", Q6, D6, 1.0)
    np.testing.assert_allclose(p, np.where(np.arange(6) == 2, math.e, 1.0) / (math.e + 5), rtol=1e-12)
    tied = probabilities("krr", [1.0, 0.0, 1.0], [1.0, 1.0, 1.0], 2.0)
    top, other = (1 + (math.e**2 - 1) / 2) / (math.e**2 + 2), 1 / (math.e**2 + 2)
    np.testing.assert_allclose(tied, [top, other, top], rtol=1e-12)
    big = log_probabilities("krr", Q6, D6, 1000.0)
    assert big[2] == pytest.approx(0.0, abs=1e-300) and big[0] == pytest.approx(-1000.0, rel=1e-12)
    np.testing.assert_allclose(probabilities("random", Q6, D6, 5.0), 1 / 6, rtol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_fast_q_prime_equals_naive_definition(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    q = rng.normal(size=n) * rng.uniform(0.01, 10)
    d = rng.uniform(0.01, 3.0, size=n)
    if seed % 2:  # ties in Δ and in q
        d = np.round(d, 1) + 0.1
        q = np.round(q, 1)
    for t in (0.0, gem_t(n, 0.5, 0.05), -gem_t(n, 0.5, 0.05), 1e3):
        fast, naive = q_prime(q, d, t), q_prime_naive(q, d, t)
        np.testing.assert_allclose(fast, naive, rtol=1e-12, atol=1e-12 * (1 + np.abs(naive).max()))
        assert fast.max() == 0.0 and (fast <= 0).all()


@pytest.mark.parametrize("ties", [False, True])
def test_q_prime_hull_prefilter_keeps_every_hull_vertex_at_catalog_scale(ties):
    """At n = 3,000 the Akl–Toussaint pre-filter drops most points before the sort (for +t);
    q' must still equal the definition, also when many points lie near one line (mgem's −t)."""
    from recsvc.mechanisms.gem import _hull_candidates

    rng = np.random.default_rng(11)
    n = 3000
    q, d = rng.normal(size=n), rng.uniform(0.05, 2.0, size=n)
    if ties:
        q, d = np.round(q, 1), np.round(d, 1) + 0.05
    for t in (gem_t(n, 1.0, 0.05), -gem_t(n, 1.0, 0.05), 0.0):
        fast, naive = q_prime(q, d, t), q_prime_naive(q, d, t)
        np.testing.assert_allclose(fast, naive, rtol=1e-12, atol=1e-12 * (1 + np.abs(naive).max()))
    assert _hull_candidates(q - gem_t(n, 1.0, 0.05) * d, d).size < n // 4  # the filter does filter


def test_gem_is_rnm_on_q_prime_with_unit_sensitivity():
    for name, sign in (("gem", 1.0), ("mgem", -1.0)):
        qp = q_prime(Q6, D6, sign * gem_t(6, 1.5, 0.1))
        np.testing.assert_allclose(
            probabilities(name, Q6, D6, 1.5, beta=0.1), probabilities("rnm", qp, np.ones(6), 1.5), rtol=1e-13
        )


@pytest.mark.parametrize("c", [0.2, 0.6, 0.9])
def test_combined_gem_is_rr_mixture_of_mgem_and_gem(c):
    eps = 2.0
    keep = math.exp(c * eps) / (1 + math.exp(c * eps))
    for d, bit in ((D_POS, 1), (D_NEG, 0), (np.ones(6), 1)):  # constant Δ: ρ undefined → 0 → bit 1
        pm = probabilities("mgem", Q6, d, (1 - c) * eps)
        pg = probabilities("gem", Q6, d, (1 - c) * eps)
        p1 = keep if bit else 1 - keep
        got = probabilities("combined_gem", Q6, d, eps, corr_budget_fraction=c)
        np.testing.assert_allclose(got, p1 * pm + (1 - p1) * pg, rtol=1e-12)


def test_combined_gem_reported_bit_is_randomised_response():
    from scipy.stats import spearmanr

    assert spearmanr(Q6, D_POS).statistic == pytest.approx(1.0)
    assert spearmanr(Q6, D_NEG).statistic == pytest.approx(-1.0)
    n_draws = 200_000
    for d, truth in ((D_POS, 1), (D_NEG, 0), (np.ones(6), 1)):  # constant Δ: ρ undefined → 0 → bit 1
        for c, eps in ((0.6, 1.0), (0.3, 4.0)):
            bits = report_correlation_bit(Q6, d, eps, {"corr_budget_fraction": c}, np.random.default_rng(11), n_draws)
            keep = 1 / (1 + math.exp(-c * eps))
            k = int((bits == truth).sum())
            assert binomtest(k, n_draws, keep).pvalue > ALPHA
            assert abs(k / n_draws - keep) < 0.006


def _mc_counts(name, q, d, eps, trials, seed, **params):
    x = select_batch(name, q[None], d, eps, trials, seed, allow_non_private=True, **params)[0]
    return np.bincount(x, minlength=q.shape[0])


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("epsilon", [0.7, 4.0])
def test_monte_carlo_matches_exact_small(name, epsilon):
    counts = _mc_counts(name, Q6, D6, epsilon, 40_000, 5)
    assert chisquare_pvalue(counts, probabilities(name, Q6, D6, epsilon)) > ALPHA


@pytest.mark.parametrize("name", ["rnm", "rnm_laplace", "pf", "em", "gem", "mgem", "combined_gem"])
def test_monte_carlo_matches_exact_at_n500(name):
    q, d = _user(500, 9)
    counts = _mc_counts(name, q, d, 10.0, 20_000, 6)
    p = probabilities(name, q, d, 10.0)
    assert (p > 1e-2).sum() >= 3, "the test must have several non-trivial cells"
    assert chisquare_pvalue(counts, p) > ALPHA


def test_monte_carlo_matches_exact_through_select():
    """The single-call path (size 1) draws from the same distribution as the batch path."""
    rng = np.random.default_rng(21)
    for name in ("rnm", "pf", "gem", "combined_gem", "krr"):
        counts = np.bincount([select(name, Q6, D6, 1.0, rng=rng) for _ in range(6000)], minlength=6)
        assert chisquare_pvalue(counts, probabilities(name, Q6, D6, 1.0)) > ALPHA


@pytest.mark.parametrize("name", [n for n, m in MECHANISMS.items() if not m.exact])
def test_monte_carlo_matches_quadrature_for_mechanisms_without_closed_form(name):
    """Every mechanism without exact probabilities has a reference (recsvc.mechanisms.testing.REFERENCE)."""
    q, d, eps = Q6[:4], D6[:4], 1.0
    params = {k: s.default for k, s in MECHANISMS[name].params.items()}
    p = REFERENCE[name](q, d, eps, **params)
    assert abs(p.sum() - 1) < 1e-8
    assert chisquare_pvalue(_mc_counts(name, q, d, eps, 30_000, 8), p) > ALPHA, name
    if MECHANISMS[name].private:  # the single-call path
        rng = np.random.default_rng(4)
        counts = np.bincount([select(name, q, d, eps, rng=rng) for _ in range(3000)], minlength=4)
        assert chisquare_pvalue(counts, p) > ALPHA, name


def test_goodness_of_fit_has_power():
    """The χ² check rejects a wrong distribution: rnm's samples against em's probabilities."""
    counts = _mc_counts("rnm", Q6, D6, 4.0, 40_000, 5)
    assert chisquare_pvalue(counts, probabilities("em", Q6, D6, 4.0)) < 1e-6
