import itertools

import numpy as np
import pytest

from eval import metrics
from eval.scenarios import SCENARIOS, SWEEP_LEVELS, scenario
from recsvc.stats import spearman_rows


def test_weighted_correlation_hand_computed():
    # Buckets over [0, 1]: scores 0 and 0.1 share bucket 1 (max Δ 2), score 1 is alone (max Δ 4),
    # so w = [0.5, 1, 1]; μ_q = 1.1/2.5 = 0.44, μ_Δ = 6.5/2.5 = 2.6.
    q, d = np.array([0.0, 0.1, 1.0]), np.array([1.0, 2.0, 4.0])
    num = 0.5 * (-0.44) * (-1.6) + (-0.34) * (-0.6) + 0.56 * 1.4  # = 1.34
    sq = 0.5 * 0.44**2 + 0.34**2 + 0.56**2  # = 0.526
    sd = 0.5 * 1.6**2 + 0.6**2 + 1.4**2  # = 3.6
    expected = num / np.sqrt(sq * sd)
    assert metrics.weighted_correlation(q, d, buckets=2)[0] == pytest.approx(expected, rel=1e-12)
    assert metrics.weighted_correlation(q, d)[0] == pytest.approx(expected, rel=1e-12)  # B = 5: same buckets
    # With one candidate per bucket every weight is 1: plain Pearson.
    q2, d2 = np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    assert metrics.weighted_correlation(q2, d2)[0] == pytest.approx(np.corrcoef(q2, d2)[0, 1], rel=1e-12)
    # Padding beyond count is ignored; constant scores are undefined (NaN).
    padded_q = np.array([[0.0, 0.1, 1.0, 99.0], [2.0, 2.0, 2.0, 2.0]])
    padded_d = np.array([[1.0, 2.0, 4.0, 50.0], [1.0, 2.0, 3.0, 4.0]])
    out = metrics.weighted_correlation(padded_q, padded_d, count=np.array([3, 4]), buckets=2)
    assert out[0] == pytest.approx(expected, rel=1e-12) and np.isnan(out[1])


def test_spearman_rows_respects_count():
    q = np.array([[1.0, 2.0, 3.0, -np.inf], [3.0, 2.0, 1.0, 0.0]])
    d = np.array([[1.0, 2.0, 3.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_allclose(spearman_rows(q, d, np.array([3, 4])), [1.0, -1.0])
    assert np.isnan(spearman_rows(np.ones((1, 4)), d[:1], None)[0])


def test_mse_and_mean_selected_hand_computed():
    q = np.array([[3.0, 1.0, 0.0]])
    mse, mean = metrics.selected_stats(q, np.array([[0, 1, 2, 1]]))
    assert mse[0] == pytest.approx((0 + 4 + 9 + 4) / 4) and mean[0] == pytest.approx(1.25)
    e_mse, e_mean = metrics.expected_stats(q[0], np.array([0.5, 0.25, 0.25]))
    assert e_mse == pytest.approx(0.25 * 4 + 0.25 * 9) and e_mean == pytest.approx(1.75)
    with pytest.raises(ValueError, match="padded"):
        metrics.selected_stats(np.array([[1.0, -np.inf]]), np.array([[1]]))


def test_log_ratio_nan_when_not_positive():
    out = metrics.log_ratio(np.array([2.0, 1.0, -1.0, 0.5]), np.array([1.0, 2.0, 1.0, 0.0]))
    np.testing.assert_allclose(out[:2], [np.log(2.0), np.log(0.5)])
    assert np.isnan(out[2:]).all()


def test_bimodal_scenarios_match_the_paper():
    s1, s2, s3 = scenario("1"), scenario("2"), scenario("3")
    for s in (s1, s2, s3):
        assert s.n == 100 and sorted(set(s.scores.tolist())) == [-1.0, 1.0] and (s.scores == 1).sum() == 50
        assert sorted(set(s.sensitivities.tolist())) == [1.0, 1.8]
        np.testing.assert_allclose(s.hi - s.lo, s.sensitivities)
    assert (s1.sensitivities[s1.scores == 1] == 1.8).all() and (s1.sensitivities[s1.scores == -1] == 1.0).all()
    assert (s2.sensitivities[s2.scores == 1] == 1.0).all() and (s2.sensitivities[s2.scores == -1] == 1.8).all()
    for grp in (1.0, -1.0):  # scenario 3: each score group half Δ 1, half Δ 1.8
        assert (s3.sensitivities[s3.scores == grp] == 1.8).sum() == 25
    assert s1.correlation()[0] == pytest.approx(1.0) and s2.correlation()[0] == pytest.approx(-1.0)
    assert s3.correlation()[0] == pytest.approx(0.0)


@pytest.mark.parametrize("name,sign", [("4", 1), ("5", -1), ("6", 0)])
def test_random_scenarios_percentile_sensitivities_and_clipping(name, sign):
    s = scenario(name, n=100, seed=3)
    assert s.draws.shape == (s.repeats, 100) and np.array_equal(s.scores, s.draws[0])
    np.testing.assert_allclose(s.sensitivities, np.maximum(s.hi - s.lo, 1e-6))
    assert (s.draws >= s.lo - 1e-12).all() and (s.draws <= s.hi + 1e-12).all()
    # 10th–90th percentiles: ~20% of each candidate's draws sit exactly on a clip bound.
    at_bound = ((s.draws == s.lo) | (s.draws == s.hi)).mean()
    assert 0.17 < at_bound < 0.23
    rho = np.median(s.correlation())
    if sign:
        assert np.sign(rho) == sign and abs(rho) > 0.3
    else:
        assert abs(rho) < 0.35
    again = scenario(name, n=100, seed=3)
    np.testing.assert_array_equal(again.draws, s.draws)
    assert not np.array_equal(scenario(name, n=100, seed=4).draws, s.draws)


def test_scenario_6_is_uncorrelated_for_every_seed():
    """The users' ρ(q, Δ) is centred on the sample correlation of μ and σ; scenario 6 keeps the
    least correlated of 64 independent (μ, σ) draws, so the population is centred on 0 (a single
    draw gave mean ρ = +0.14 and 96% of users with ρ > 0 at seed 0)."""
    for seed in range(10):
        rho = scenario("6", seed=seed).correlation()
        assert abs(rho.mean()) < 0.03 and 0.35 < (rho > 0).mean() < 0.65, (seed, rho.mean(), (rho > 0).mean())
    assert scenario("6", n=10, repeats=5).draws.shape == (5, 10)


def test_polarised_scenarios():
    s7 = scenario("7", repeats=400)
    rho = s7.correlation()
    assert rho[s7.groups == 1].min() > 0.8 and rho[s7.groups == 0].max() < -0.8  # strongly polarised
    rho8 = scenario("8", repeats=400).correlation()
    assert 0.2 < np.median(np.abs(rho8)) < np.median(np.abs(rho))  # weaker, noisier


def test_sweep_scenario_rows_are_independent_instances_whose_correlation_follows_t():
    for seed in (0, 1):
        sweeps = [scenario("sweep", level=t, seed=seed) for t in SWEEP_LEVELS]
        for t, s in zip(SWEEP_LEVELS, sweeps, strict=False):
            assert s.repeats == 100 and s.level == t and f"t = {t:g}" in s.description
            assert s.sensitivities.shape == s.draws.shape == s.lo.shape == (100, 100)
            # Per instance: Δ = (t x + z)/5 shifted so that its minimum is 0 (floored at 1e-6);
            # the range is centred on the score, so clipping changes nothing.
            assert (s.sensitivities.min(axis=1) == 1e-6).all() and (s.sensitivities > 0).all()
            np.testing.assert_allclose(s.hi - s.lo, s.sensitivities)
            np.testing.assert_allclose((s.lo + s.hi) / 2, s.draws)
            q0, d0 = s.row(0)
            assert np.array_equal(q0, s.scores) and np.array_equal(d0, s.sensitivities[0])
            assert not np.array_equal(s.draws[0], s.draws[1])  # every row its own instance
            if t:  # the linear relationship, pooled over the instances: slope t/5
                slope = np.polyfit(s.draws.ravel(), s.sensitivities.ravel(), 1)[0]
                assert abs(slope - t / 5) < 0.05 * abs(t) / 5 + 0.01, (t, slope)
        rho = [float(np.median(s.correlation())) for s in sweeps]
        assert all(a < b for a, b in itertools.pairwise(rho)), rho  # strictly increasing with t
        assert rho[0] < -0.95 and rho[-1] > 0.95 and abs(rho[3]) < 0.05, rho
    # Same seed, same instances; the level changes Δ but not the scores (x is drawn first).
    a, b = scenario("sweep", level=0.3, seed=5, repeats=3), scenario("sweep", level=0.3, seed=5, repeats=3)
    np.testing.assert_array_equal(a.sensitivities, b.sensitivities)
    np.testing.assert_array_equal(scenario("sweep", level=-5, seed=5, repeats=3).draws, a.draws)
    assert a.correlation().shape == (3,)


def test_bad_scenario_input():
    with pytest.raises(ValueError, match=r"unknown scenario '9'.*1, 2, 3"):
        scenario("9")
    with pytest.raises(ValueError, match="n ≥ 2"):
        scenario("4", n=1)
    with pytest.raises(ValueError, match="repeats"):
        scenario("4", repeats=0)
    assert set(SCENARIOS) == {"1", "2", "3", "4", "5", "6", "7", "8", "sweep"}


def test_running_mean_is_the_same_bits_for_any_chunking():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 3, 4)) * 10 + 3
    x[rng.random(x.shape) < 0.1] = np.nan  # skipped, per cell
    results = []
    for sizes in ([1000], [7] * 142 + [6], [64] * 15 + [40], [1, 2, 997], [300, 300, 400]):
        acc = metrics.RunningMean((3, 4))
        start = 0
        for size in sizes:
            acc.add(x[start : start + size])
            start += size
        acc.flush()
        results.append(acc.ci())
    mean, half = results[0]
    for m, h in results[1:]:
        assert np.array_equal(m, mean) and np.array_equal(h, half)
    n = np.isfinite(x).sum(axis=0)
    np.testing.assert_allclose(mean, np.nanmean(x, axis=0), rtol=1e-12)
    np.testing.assert_allclose(half, 1.959963984540054 * np.nanstd(x, axis=0, ddof=1) / np.sqrt(n), rtol=1e-10)
    # The last partial block must be merged before reading.
    acc = metrics.RunningMean((2,))
    acc.add(np.ones((3, 2)))
    with pytest.raises(RuntimeError, match="flush"):
        acc.ci()
    acc.flush()
    m, h = acc.ci()
    assert m.tolist() == [1.0, 1.0] and h.tolist() == [0.0, 0.0]
    empty = metrics.RunningMean((1,))
    empty.flush()
    assert np.isnan(empty.ci()[0]).all() and np.isnan(empty.ci()[1]).all()
