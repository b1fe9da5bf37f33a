"""The device's lattice signal is exactly ε-local-DP: the exact pmf ratio between the signals of
any two lattice points is at most e^ε and reaches it on the worst pair; the sampler follows the
exact discrete Laplace pmf (chi-square); the shared test vectors (docs/reference/
multiselect-vectors.json) give the same integers; the rounding's bound holds."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from recsvc.checks import ParamError
from recsvc.multiselection import (
    GRID_STEPS,
    Lattice,
    Words,
    bernoulli_exp,
    clip_l1,
    discrete_laplace,
    discrete_laplace_log_pmf,
    embed,
    lattice_log_likelihood,
    pull_in,
    rate,
    uniform_below,
)

VECTORS = Path(__file__).parents[2] / "docs" / "reference" / "multiselect-vectors.json"


def _exact_log_ratio(z: int, a: int, b: int, r: Fraction) -> Fraction:
    """log P(z | a) − log P(z | b) for one coordinate of noise P(x) ∝ exp(−|x|·r), exactly."""
    return r * (abs(z - b) - abs(z - a))


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.7])
def test_the_exact_pmf_ratio_never_exceeds_epsilon_and_reaches_it_on_the_worst_pair(epsilon: float) -> None:
    d = 5
    grid = Lattice.of(1.0, d)
    s, t = rate(epsilon, grid.sensitivity)
    r = Fraction(s, t)
    assert r == Fraction(epsilon) / (2 * grid.radius)  # exactly ε/Δ
    rng = np.random.default_rng(0)
    clipped = [clip_l1(rng.normal(size=d) * m, 1.0) for m in (0.01, 0.3, 5.0, 50.0)]
    points = [grid.point(c) for c in clipped]
    worst = np.zeros(d, dtype=np.int64)
    worst[0] = grid.radius
    points += [worst, -worst]  # the antipodal pair at L1 distance Δ
    top = Fraction(0)
    for a in points:
        for b in points:
            # The ratio is a product over coordinates, so its max over z is the sum of each
            # coordinate's max, found by enumerating z over a window that holds every breakpoint.
            total = Fraction(0)
            for j in range(d):
                lo, hi = min(a[j], b[j]) - 3, max(a[j], b[j]) + 3
                total += max(_exact_log_ratio(z, int(a[j]), int(b[j]), r) for z in range(lo, hi + 1))
            assert total <= Fraction(epsilon)
            top = max(top, total)
    assert abs(float(top) - epsilon) <= 1e-12 and top == Fraction(epsilon)
    # The float log-pmf the server and the audit use agrees with the exact ratio.
    lp = discrete_laplace_log_pmf
    z = grid.radius + 10
    assert lp(z + grid.radius, s, t) - lp(z - grid.radius, s, t) == pytest.approx(-epsilon, abs=1e-12)


def test_the_pmf_sums_to_one() -> None:
    s, t = rate(1.0, 4)
    x = np.arange(-400, 401)
    assert np.exp(discrete_laplace_log_pmf(x, s, t)).sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 2), (0.7, 4), (3.0, 2)])
def test_the_sampler_follows_the_exact_discrete_laplace_pmf(epsilon: float, delta: int) -> None:
    s, t = rate(epsilon, delta)
    words = Words(np.random.default_rng(12345))
    n = 20_000
    x = np.array([discrete_laplace(s, t, words) for _ in range(n)])
    cells = np.arange(60)
    m = int(cells[n * np.exp(discrete_laplace_log_pmf(cells, s, t)) >= 10].max())  # every cell, tail too, expects ≥ 5
    edges = np.arange(-m, m + 1)
    p = np.exp(discrete_laplace_log_pmf(edges, s, t))
    observed = np.array([(x == e).sum() for e in edges] + [(np.abs(x) > m).sum()])
    expected = np.concatenate([p, [1 - p.sum()]]) * n
    assert expected.min() > 5
    assert stats.chisquare(observed, expected).pvalue > 1e-3  # fixed seed: deterministic
    # The test has power: the law at twice the rate is rejected.
    p2 = np.exp(discrete_laplace_log_pmf(edges, 2 * s, t))
    wrong = np.concatenate([p2, [1 - p2.sum()]]) * n
    assert stats.chisquare(observed, wrong).pvalue < 1e-6


def test_bernoulli_exp_has_probability_exp_minus_gamma() -> None:
    words = Words(np.random.default_rng(7))
    for num, den in ((0, 3), (1, 3), (3, 2), (5, 1)):
        hits = sum(bernoulli_exp(num, den, words) for _ in range(20_000))
        p = np.exp(-num / den)
        assert stats.binomtest(hits, 20_000, p).pvalue > 1e-4


def test_uniforms_mask_the_words_and_reject_what_is_too_large() -> None:
    assert uniform_below(1, Words([])) == 0
    assert uniform_below(5, Words([0xFFFFFFF8])) == 0
    assert uniform_below(5, Words([7, 4])) == 4
    assert uniform_below(2**40, Words([0xFFFFFF01, 2])) == (1 << 32) + 2
    with pytest.raises(ParamError, match="random words ran out"):
        uniform_below(5, Words([7, 6]))
    with pytest.raises(ParamError, match=r"a random word must be an integer in \[0, 2\*\*32\); got 4294967296"):
        Words([2**32])


def test_the_shared_vectors_give_the_same_integers_from_exactly_their_words() -> None:
    doc = json.loads(VECTORS.read_text())
    assert len(doc["vectors"]) >= 5
    for v in doc["vectors"]:
        factors = np.array(v["factors"], dtype=np.float64)
        grid = Lattice.of(v["radius"], factors.shape[1])
        assert (grid.step, grid.radius) == (v["grid_step"], v["lattice_radius"])
        clipped = clip_l1(embed(v["history_rows"], factors), v["radius"])
        np.testing.assert_allclose(clipped, v["clipped"], rtol=0, atol=1e-12)
        assert grid.point(clipped).tolist() == v["point"], v["name"]
        words = Words(v["words"])
        assert grid.signal(clipped, v["epsilon"], words).tolist() == v["signal"], v["name"]
        assert words.used == len(v["words"])
        with pytest.raises(ParamError, match="ran out"):
            grid.signal(clipped, v["epsilon"], Words(v["words"][:-1]))
    for p in doc["pull_in"]:
        assert pull_in(np.array(p["point"]), p["lattice_radius"]).tolist() == p["pulled"]


def test_every_lattice_point_is_within_the_integer_radius_and_near_the_embedding() -> None:
    d = 32
    grid = Lattice.of(0.8, d)
    assert (grid.step, grid.radius, grid.sensitivity) == (0.8 / GRID_STEPS, GRID_STEPS + 16, 2 * (GRID_STEPS + 16))
    rng = np.random.default_rng(3)
    e = clip_l1(rng.standard_cauchy(size=(2000, d)), 0.8)  # nearly all on the sphere ‖ê‖₁ = R
    a = grid.point(e)
    assert np.abs(a).sum(axis=1).max() <= grid.radius
    assert np.abs(a - e / grid.step).max() <= 0.5 + 1e-9  # the pull never triggers on these
    # Half steps round to even, as the spec says.
    assert grid.point(np.array([2.5, -3.5, 0.5, 1.5] + [0.0] * 28) * grid.step).tolist()[:4] == [2, -4, 0, 2]
    # A point over the radius is pulled in: the largest coordinate first, the first on ties.
    assert pull_in(np.array([3, -3, 1]), 5).tolist() == [2, -2, 1]


def test_the_server_likelihood_is_the_exact_lattice_distance_times_epsilon_over_delta() -> None:
    grid = Lattice.of(1.0, 3)
    points = np.array([[0, 0, 0], [10, -5, 2], [-4098, 0, 0]], dtype=np.int64)
    z = np.array([7, 7, -7])
    ll = lattice_log_likelihood(z, points, 0.5, grid)
    want = -np.array([21, 3 + 12 + 9, 4105 + 7 + 7]) * 0.5 / grid.sensitivity
    np.testing.assert_allclose(ll, want, rtol=1e-15)
    with pytest.raises(ParamError, match=r"signal has shape \(2,\); expected \(3,\)"):
        lattice_log_likelihood(z[:2], points, 0.5, grid)
