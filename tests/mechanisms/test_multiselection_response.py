"""The server's best k offsets for a Laplace signal: the closed form for h(t) = t against the
source paper and a brute-force optimisation, the numeric optimiser for h(t) = t² against a grid
search, Monte Carlo checks of the expected error, and the O(1/(εk)) rate."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize

from recsvc.checks import ParamError
from recsvc.multiselection import (
    check_disutility,
    expected_error,
    identity_error,
    identity_expected_error,
    identity_offsets,
    monte_carlo_error,
    optimal_response,
    signal_cdf,
)


def identity(t):
    return t


def test_k3_at_epsilon_1_gives_the_papers_offsets_and_they_scale_as_one_over_epsilon():
    log4 = math.log(4.0)
    np.testing.assert_allclose(identity_offsets(1.0, 3), [-log4, 0.0, log4], rtol=0, atol=1e-9)
    for eps in (0.3, 2.0):
        np.testing.assert_allclose(identity_offsets(eps, 3), np.array([-log4, 0.0, log4]) / eps, atol=1e-9)
    assert identity_error(1.0, 3) == 0.5


@pytest.mark.parametrize("epsilon", (0.5, 1.0, 3.0))
def test_the_closed_form_is_stationary_and_its_error_is_the_exact_objective(epsilon):
    for k in range(1, 65):
        a = identity_offsets(epsilon, k)
        assert a.shape == (k,) and np.all(np.diff(a) > 0)
        np.testing.assert_allclose(a, -a[::-1], atol=1e-12)  # symmetric
        assert identity_expected_error(a, epsilon) == pytest.approx(identity_error(epsilon, k), rel=1e-12)
        # Each offset is the median of its cell (the objective's gradient is 0).
        mid = (a[1:] + a[:-1]) / 2
        lo, hi = np.r_[-np.inf, mid], np.r_[mid, np.inf]
        cdf_a, cdf_lo, cdf_hi = (signal_cdf(x, 0.0, epsilon) for x in (a, lo, hi))
        np.testing.assert_allclose(cdf_a - cdf_lo, cdf_hi - cdf_a, atol=1e-12)


@pytest.mark.parametrize("k", range(1, 7))
def test_the_closed_form_is_the_brute_force_minimum_for_the_identity(k):
    """Nelder–Mead on the exact objective from random starts (no symmetry assumed) finds nothing
    better than the closed form, and its best point is the closed form."""
    rng = np.random.default_rng(k)
    best_value, best_x = math.inf, None
    for _ in range(6):
        start = np.sort(rng.uniform(-4.0, 4.0, size=k))
        res = optimize.minimize(
            lambda x: identity_expected_error(x, 1.0),
            start,
            method="Nelder-Mead",
            options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 20_000, "maxfev": 20_000},
        )
        if res.fun < best_value:
            best_value, best_x = res.fun, np.sort(res.x)
    assert best_value >= identity_error(1.0, k) - 1e-12
    assert best_value == pytest.approx(identity_error(1.0, k), abs=1e-9)
    np.testing.assert_allclose(best_x, identity_offsets(1.0, k), atol=1e-4)


def test_the_quadrature_matches_the_exact_identity_objective_on_arbitrary_offsets():
    rng = np.random.default_rng(3)
    for eps in (0.3, 1.0, 4.0):
        for k in (1, 2, 5, 9):
            a = rng.normal(scale=3.0 / eps, size=k)
            assert expected_error(a, eps, identity) == pytest.approx(identity_expected_error(a, eps), rel=1e-10)
            assert expected_error(a, eps) == identity_expected_error(a, eps)
    for a in (-2.0, 0.0, 0.7):  # E[(X − a)²] = 2/ε² + a²
        assert expected_error([a], 0.5, np.square) == pytest.approx(8.0 + a * a, rel=1e-10)


def _partial_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """∫_{−∞}^x t^j dF(t), j = 0, 1, 2, for Laplace(0, 1), from the antiderivatives."""
    with np.errstate(invalid="ignore", over="ignore"):
        e_lo, e_hi = 0.5 * np.exp(np.minimum(x, 0)), 0.5 * np.exp(-np.maximum(x, 0))
        low = (e_lo, (x - 1) * e_lo, (x * x - 2 * x + 2) * e_lo)
        high = (1 - e_hi, -(x + 1) * e_hi, 2 - (x * x + 2 * x + 2) * e_hi)
    limit = {-np.inf: (0.0, 0.0, 0.0), np.inf: (1.0, 0.0, 2.0)}
    out = []
    for j in range(3):
        m = np.where(x <= 0, low[j], high[j])
        for end, values in limit.items():
            m = np.where(x == end, values[j], m)
        out.append(m)
    return out[0], out[1], out[2]


def grid_objective(candidates: np.ndarray, epsilon: float) -> np.ndarray:
    """E[min_i (X − a_i)²] for each row of sorted ``candidates``, exact from the partial moments on
    each Voronoi cell: E[(X − a)²; cell] = M2 − 2a·M1 + a²·M0. A reference that shares no code with
    the module (which integrates by quadrature)."""
    c = candidates * epsilon
    mid = (c[:, 1:] + c[:, :-1]) / 2
    edges = np.concatenate((np.full((c.shape[0], 1), -np.inf), mid, np.full((c.shape[0], 1), np.inf)), axis=1)
    m0, m1, m2 = (np.diff(m, axis=1) for m in _partial_moments(edges))
    return (m2 - 2 * c * m1 + c * c * m0).sum(axis=1) / epsilon**2


@pytest.mark.parametrize(("k", "step", "reach"), [(1, 0.005, 2.0), (2, 0.01, 3.0), (3, 0.04, 3.5)])
def test_the_numeric_optimum_for_squared_error_beats_a_brute_force_grid(k, step, reach):
    epsilon = 1.0
    grid = np.arange(-reach, reach + step / 2, step)
    # Every sorted k-subset of the grid (itertools.combinations' order), gathered by index: ~10⁶ rows at k = 3.
    chosen = itertools.chain.from_iterable(itertools.combinations(range(grid.size), k))
    candidates = grid[np.fromiter(chosen, dtype=np.intp).reshape(-1, k)]
    values = grid_objective(candidates, epsilon)
    best = int(np.argmin(values))
    response = optimal_response(epsilon, k, np.square)
    reference = grid_objective(response.offsets[None, :], epsilon)[0]
    assert reference == pytest.approx(response.error, rel=1e-10)  # the two objectives agree
    assert reference <= values[best] + 1e-12  # nothing on the grid is better
    assert values[best] - reference < 2 * step**2  # and the grid's best is close
    np.testing.assert_allclose(candidates[best], response.offsets, atol=1.5 * step)
    assert response.k == k and response.epsilon == epsilon


def test_squared_error_puts_each_point_at_its_cells_mean():
    """For h(t) = t² the Exponential tail's mean lies 1/ε past the cell's edge: ±1/ε for k = 2,
    {−2, 0, 2}/ε for k = 3."""
    for eps in (0.5, 2.0):
        two, three = optimal_response(eps, 2, np.square), optimal_response(eps, 3, np.square)
        np.testing.assert_allclose(two.offsets, np.array([-1.0, 1.0]) / eps, atol=1e-5 / eps)
        np.testing.assert_allclose(three.offsets, np.array([-2.0, 0.0, 2.0]) / eps, atol=1e-5 / eps)
        assert two.error == pytest.approx(1.0 / eps**2, rel=1e-10)  # the Exponential's variance


def test_the_numeric_optimiser_recovers_the_identity_closed_form_from_other_starts():
    for eps, k in ((0.5, 4), (2.0, 5)):
        response = optimal_response(eps, k, identity)
        np.testing.assert_allclose(response.offsets, identity_offsets(eps, k), atol=1e-5 / eps)
        assert response.error == pytest.approx(identity_error(eps, k), rel=1e-10)


@pytest.mark.parametrize(("epsilon", "k"), [(0.5, 1), (1.0, 3), (2.0, 4), (0.3, 10)])
def test_monte_carlo_agrees_with_the_expected_error(epsilon, k):
    rng = np.random.default_rng(100 + k)
    response = optimal_response(epsilon, k)
    mean, se = monte_carlo_error(response.offsets, epsilon, 200_000, rng)
    assert abs(mean - response.error) < 4 * se
    assert se < 0.01 * response.error  # the check has power


def test_monte_carlo_agrees_with_the_numeric_squared_error():
    response = optimal_response(0.7, 3, np.square)
    mean, se = monte_carlo_error(response.offsets, 0.7, 200_000, np.random.default_rng(5), np.square)
    assert abs(mean - response.error) < 4 * se


def test_epsilon_k_error_levels_off_at_two():
    """f(ε, k) = Θ(1/(εk)): ε·k·f rises to 2 and is flat by k = 8 … 64."""
    for eps in (0.3, 1.0, 2.0):
        ks = np.arange(8, 65)
        scaled = np.array([eps * k * identity_error(eps, k) for k in ks])
        assert np.all(np.diff(scaled) > 0) and np.all(scaled < 2.0)
        assert scaled[0] > 1.75 and scaled.max() - scaled.min() < 0.25
        assert 2.0 - scaled[-1] < 0.04
        assert np.all(2.0 - scaled <= 2.0 / ks)  # 2 − εkf ≤ 2/k


@pytest.mark.parametrize("bad", (0.0, -0.5, float("nan"), float("inf")))
def test_a_bad_epsilon_is_a_param_error(bad):
    for call in (
        lambda: identity_offsets(bad, 3),
        lambda: identity_error(bad, 3),
        lambda: optimal_response(bad, 2, np.square),
        lambda: expected_error([0.0], bad),
    ):
        with pytest.raises(ParamError, match="epsilon"):
            call()


@pytest.mark.parametrize("bad", (0, -2, 1.5, True, "3"))
def test_a_bad_k_is_a_param_error(bad):
    with pytest.raises(ParamError, match="k must be an integer ≥ 1"):
        optimal_response(1.0, bad)
    with pytest.raises(ParamError, match="k must be an integer ≥ 1"):
        identity_offsets(1.0, bad)


@pytest.mark.parametrize(
    ("h", "message"),
    [
        (np.negative, "non-decreasing"),
        (np.cos, "non-decreasing"),
        (lambda t: np.minimum(t, 1.0) - 0.5 * (t > 2.0), "non-decreasing"),  # a drop far from 0
        (lambda t: 1.0, "same shape"),
        (lambda t: np.where(t > 1.0, np.inf, t), "finite"),
    ],
)
def test_a_disutility_that_is_not_non_decreasing_is_refused(h, message):
    with pytest.raises(ParamError, match=message):
        check_disutility(h, 1.0)
    with pytest.raises(ParamError, match=message):
        optimal_response(1.0, 2, h)
    with pytest.raises(ParamError, match=message):
        monte_carlo_error([0.0, 1.0], 1.0, 100, np.random.default_rng(0), h)


def test_bad_offsets_are_a_param_error():
    for bad in ([], [0.0, np.nan], [[0.0]]):
        with pytest.raises(ParamError, match="offsets"):
            expected_error(bad, 1.0)
