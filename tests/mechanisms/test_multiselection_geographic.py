"""The device's Laplace noise is ε-geographically DP: exact audits of the density ratio and of
interval probabilities, and a goodness-of-fit test of the sampler."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from recsvc.checks import ParamError
from recsvc.multiselection import (
    geographic_excess,
    interval_log_ratio,
    laplace_scale,
    privacy_loss,
    sample_signal,
    signal_cdf,
    signal_log_density,
)

EPSILONS = (0.3, 1.0, 2.5)
U = np.linspace(-3.0, 3.0, 25)
Z = np.linspace(-8.0, 8.0, 321)  # reaches past every u on both sides, where the bound is tight
TOL = 1e-12


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_log_density_ratio_never_exceeds_epsilon_times_the_distance_and_reaches_it(epsilon):
    u, v, z = U[:, None, None], U[None, :, None], Z[None, None, :]
    excess = geographic_excess(z, u, v, epsilon)
    assert excess.max() <= TOL
    worst = excess.max(axis=2)  # over z, for each pair (u, u')
    assert np.all(np.abs(worst) <= TOL)  # tight for every pair: the bound cannot be lowered
    loss = privacy_loss(z, u, v, epsilon)
    direct = signal_log_density(z, u, epsilon) - signal_log_density(z, v, epsilon)
    np.testing.assert_allclose(loss, direct, atol=1e-12)


def test_the_audit_catches_noise_too_small_for_the_declared_epsilon():
    u, v, z = U[:, None, None], U[None, :, None], Z[None, None, :]
    declared = 1.0
    loss = privacy_loss(z, u, v, 2 * declared)  # scale 1/(2ε): twice the allowed loss
    excess = loss - declared * np.abs(u - v)
    assert excess.max() == pytest.approx(declared * 6.0)  # |u − u'| = 6 at the grid's ends


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_interval_probabilities_obey_the_definition_and_far_intervals_are_tight(epsilon):
    edges = np.linspace(-10.0, 10.0, 41)
    lo, hi = np.meshgrid(edges, edges, indexing="ij")
    keep = lo < hi
    lo, hi = lo[keep][None, None, :], hi[keep][None, None, :]
    u, v = U[:, None, None], U[None, :, None]
    ratio = interval_log_ratio(lo, hi, u, v, epsilon)
    allowance = epsilon * np.abs(u - v)
    assert (ratio - allowance).max() <= 1e-9
    # An interval beyond both values, on u's side, has ratio exactly e^{ε|u−u'|}.
    far = interval_log_ratio(3.5, 9.0, 3.0, -2.0, epsilon)
    assert float(far) == pytest.approx(epsilon * 5.0, abs=1e-9)


@pytest.mark.parametrize("epsilon", (0.5, 2.0))
def test_the_signal_is_the_value_plus_laplace_noise_of_scale_one_over_epsilon(epsilon):
    rng = np.random.default_rng(7)
    u = np.full(20_000, 1.5)
    z = sample_signal(u, epsilon, rng)
    assert stats.kstest(z, lambda x: signal_cdf(x, 1.5, epsilon)).pvalue > 1e-3
    assert laplace_scale(epsilon) == 1.0 / epsilon
    # The CDF is the density's integral.
    grid = np.linspace(-20.0, 23.0, 200_001)
    dens = np.exp(signal_log_density(grid, 1.5, epsilon))
    cum = np.concatenate(([0.0], np.cumsum((dens[1:] + dens[:-1]) / 2 * np.diff(grid))))
    np.testing.assert_allclose(cum + signal_cdf(grid[0], 1.5, epsilon), signal_cdf(grid, 1.5, epsilon), atol=1e-6)


@pytest.mark.parametrize("bad", (0, -1.0, float("nan"), float("inf"), "1", True))
def test_a_bad_epsilon_is_a_param_error(bad):
    with pytest.raises(ParamError, match="epsilon"):
        laplace_scale(bad)
    with pytest.raises(ParamError, match="epsilon"):
        geographic_excess(0.0, 0.0, 1.0, bad)


def test_an_empty_interval_is_a_param_error():
    with pytest.raises(ParamError, match="lo must be below hi"):
        interval_log_ratio(1.0, 1.0, 0.0, 0.5, 1.0)
