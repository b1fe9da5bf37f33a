"""gem and mgem slates peeled natively (recsvc/mechanisms/gem_peel.py): each step's exceedance
sampler against the exact law of rnm on q' in every regime it has (a concentrated law, light
candidates reached only by geometric skips, the dense path), whole slates against their
exact peeled law (the upper hull carried over between steps),
and the work estimate."""

import numpy as np
import pytest

from recsvc.mechanisms import select_slate, slate_probabilities
from recsvc.mechanisms.exact import exponential_noisy_max_log_probabilities
from recsvc.mechanisms.gem import q_prime
from recsvc.mechanisms.gem_peel import _DENSE, _HEAVY, _LAST, PASS_COST, _step
from recsvc.mechanisms.slate import native_peel_work
from recsvc.mechanisms.testing import chisquare_pvalue
from recsvc.rng import csprng

ALPHA = 1e-3
NO_HULL = np.empty(0, np.int64)
DRAWS = 20_000


def _step_law(s, d, half_eps):
    u = q_prime(s, d, 0.0) * half_eps  # q' of (q, Δ, t) is q' of (s, Δ, 0)
    return np.exp(exponential_noisy_max_log_probabilities(u))


def _draw_counts(s, d, half_eps, seed):
    g = np.random.default_rng(seed)
    return np.bincount([_step(s, d, half_eps, g, NO_HULL, False)[0] for _ in range(DRAWS)], minlength=s.shape[0])


def _pooled(counts, p):
    """Counts and probabilities with the cells of expected count < 20 pooled into one."""
    big = p * DRAWS >= 20
    c, e = counts[big], p[big]
    if (~big).any():
        c, e = np.append(c, counts[~big].sum()), np.append(e, p[~big].sum())
    return c, e


def _heavies(s, d, half_eps):
    top = int(np.argmax(s))
    ub = np.minimum(0.0, (s - s[top]) / (d + d[top])) * half_eps
    return int((ub > -_HEAVY * np.log(2.0)).sum()) - 1


CASES = {
    # few candidates, random Δ: every one heavy
    "small": (np.random.default_rng(1).normal(size=6), np.random.default_rng(2).uniform(0.1, 0.6, 6), 3.0),
    # 40 candidates, many trials succeed in each draw
    "hull": (np.random.default_rng(3).normal(size=40) * 0.3, np.random.default_rng(4).uniform(0.1, 0.6, 40), 3.0),
}
# equal Δ: u_a = (s_a − s_top)/2 · ε/2 exactly; 2,000 light candidates at p ≈ 2^−9 each carry
# most of the mass, so the geometric skips decide most draws
_LIGHT_S = np.r_[0.0, np.full(2000, -9 * np.log(2.0) * 2 / 0.5) + np.linspace(-0.5, 0.0, 2000)]
CASES["light"] = (_LIGHT_S, np.ones_like(_LIGHT_S), 0.5)
# a flat law over 600 candidates: more heavy ones than _DENSE, so the step draws densely
CASES["dense"] = (np.random.default_rng(5).normal(size=600) * 0.1, np.random.default_rng(6).uniform(0.1, 0.6, 600), 0.3)


@pytest.mark.parametrize("case", list(CASES))
def test_each_step_follows_the_exact_law_of_rnm_on_q_prime(case):
    s, d, half_eps = CASES[case]
    heavy = _heavies(s, d, half_eps)
    assert (heavy > _DENSE) == (case == "dense")
    p = _step_law(s, d, half_eps)
    if case == "light":  # the light candidates' share of the law is what this case is about
        assert p[1:].sum() > 0.7 and heavy == 0
    counts = _draw_counts(s, d, half_eps, seed=len(case))
    c, e = _pooled(counts, p)
    assert chisquare_pvalue(c, e) > ALPHA


def test_the_pooled_light_cells_are_not_all_the_power():
    """The light case's per-candidate cells are small; its chi-square must still see a wrong law:
    the same draws against the law with the light candidates' mass halved fail."""
    s, d, half_eps = CASES["light"]
    p = _step_law(s, d, half_eps)
    wrong = p.copy()
    wrong[1:] /= 2
    wrong /= wrong.sum()
    counts = _draw_counts(s, d, half_eps, seed=5)
    assert chisquare_pvalue(*_pooled(counts, wrong)) < 1e-12


@pytest.mark.parametrize("name", ["gem", "mgem"])
@pytest.mark.parametrize("eps", [2.0, 40.0])
def test_native_slates_follow_the_exact_peeled_law(name, eps):
    q = np.array([0.3, 1.0, -0.5, 0.8, 0.1])
    d = np.array([0.5, 2.0, 0.2, 1.0, 0.7])
    p = slate_probabilities(name, q, d, eps, 3)
    outcomes = list(p)
    index = {s: i for i, s in enumerate(outcomes)}
    rng = np.random.default_rng(17)
    counts = np.zeros(len(outcomes))
    for _ in range(8_000):
        counts[index[tuple(select_slate(name, q, d, eps, 3, rng).tolist())]] += 1
    assert chisquare_pvalue(counts, np.array([p[s] for s in outcomes])) > ALPHA


def test_catalog_scale_slates_are_distinct_and_favour_the_top():
    """n = 5,000 at ε = 10⁶: t ≈ 0, so each step's sure winner is the survivors' top score. The
    kernel draws from the service's own generator (ChaCha20) as from numpy's."""
    rng = np.random.default_rng(8)
    q, d = rng.uniform(0, 1, 5000), rng.uniform(0.01, 0.05, 5000)
    slate = select_slate("mgem", q, d, 1e6, 5, csprng())
    assert slate.tolist() == np.argsort(-q)[:5].tolist()


def test_the_work_estimate_follows_the_first_steps_law():
    """What a service prices a native peel at: two passes per step plus its trials, or, for a
    flat law that draws densely, a draw per candidate as well; no estimate where nothing peels natively."""
    rng = np.random.default_rng(10)
    n, k = 4000, 10
    d = 0.005 * np.exp(rng.normal(0.0, 1.0, n))  # skewed, as a catalog's sensitivities are
    concentrated = rng.uniform(0, 0.003, n)  # t·Δ dominates: a handful of candidates compete
    heavy = _heavies(concentrated + 2 * np.log(n / 0.05) / 0.1 * d, d, 0.05)
    assert heavy < _DENSE
    expected = k * (n * PASS_COST + 2 * heavy + _LAST)
    assert native_peel_work("mgem", concentrated, d, 1.0, k, {}) == pytest.approx(expected)
    flat = np.zeros(n)  # equal scores, Δ nearly equal: every candidate competes
    assert native_peel_work("mgem", flat, np.full(n, 0.02), 1.0, k, {}) == pytest.approx(k * n * (1 + PASS_COST))
    assert native_peel_work("mgem", flat, d, 1.0, 1, {}) is None  # k = 1 is select's own draw
    assert native_peel_work("rnm", flat, d, 1.0, k, {}) is None
    assert native_peel_work("clm", flat, d, 1.0, k, {}) is None
