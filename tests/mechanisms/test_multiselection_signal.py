"""The device's d-dimensional signal is local ε-DP: its noise is Laplace(2R/ε) per coordinate (KS
test), and the exact density ratio between the signals of ANY two histories is at most e^ε."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from recsvc.multiselection import clip_l1, device_signal, embed, embedding_version, noise_scale

pytestmark = pytest.mark.float_paths  # its floats come from BLAS, numpy's SIMD loops or numba

D, N_ITEMS, R = 6, 50, 1.5
FACTORS = np.random.default_rng(11).normal(size=(N_ITEMS, D))
FACTORS[1] = -FACTORS[0]  # items 0 and 1 embed in opposite directions: histories at distance 2R


def _log_density(s: np.ndarray, e: np.ndarray, b: float) -> np.ndarray:
    """log of Π_j Laplace(s_j; e_j, b), broadcast over leading axes."""
    return np.asarray((-np.abs(s - e) / b - np.log(2 * b)).sum(axis=-1))


def _far_apart_histories() -> tuple[np.ndarray, np.ndarray]:
    """The histories {0} and {1}: their clipped embeddings are e and −e on the sphere ‖·‖₁ = R, L1
    distance 2R, the ball's diameter, where the bound is tight."""
    e1, e2 = embed([0], FACTORS), embed([1], FACTORS)
    assert np.abs(e1).sum() > R  # both are clipped onto the sphere
    return clip_l1(e1, R), clip_l1(e2, R)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_the_noise_is_laplace_with_scale_2r_over_epsilon(epsilon):
    rng = np.random.default_rng(5)
    e = embed([3, 7, 9, 20], FACTORS)
    clipped = clip_l1(e, R)
    signals = np.stack([device_signal(e, epsilon, R, rng) for _ in range(3000)])
    b = noise_scale(epsilon, R)
    assert b == pytest.approx(2 * R / epsilon)
    z = (signals - clipped) / b
    for j in range(D):  # each coordinate, Bonferroni over D
        assert stats.kstest(z[:, j], "laplace").pvalue > 1e-3 / D
    assert stats.kstest(z.ravel(), "laplace").pvalue > 1e-3
    # The test has power: half or double the scale is rejected.
    assert stats.kstest(2 * z.ravel(), "laplace").pvalue < 1e-6
    assert stats.kstest(z.ravel() / 2, "laplace").pvalue < 1e-6
    # Coordinates are independent: their empirical correlations are at the 1/√n noise level.
    corr = np.corrcoef(z.T)[np.triu_indices(D, 1)]
    assert np.abs(corr).max() < 5 / np.sqrt(len(z))


def test_every_clipped_embedding_is_within_the_radius():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = rng.choice(N_ITEMS, int(rng.integers(0, 20)), replace=False)
        assert np.abs(clip_l1(embed(rows, FACTORS), R)).sum() <= R * (1 + 1e-12)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0])
def test_the_density_ratio_between_any_two_histories_never_exceeds_e_to_the_epsilon(epsilon):
    rng = np.random.default_rng(1)
    b = noise_scale(epsilon, R)
    histories = [rng.choice(N_ITEMS, int(rng.integers(0, 15)), replace=False) for _ in range(40)]
    clipped = np.stack([clip_l1(embed(h, FACTORS), R) for h in histories])
    a, c = _far_apart_histories()
    clipped = np.vstack([clipped, a, c])
    assert np.abs(a - c).sum() == pytest.approx(2 * R)
    # Signals near the embeddings and far out in every orthant, where the ratio is largest.
    points = np.vstack([rng.laplace(0, b, (400, D)), 10 * R * np.sign(rng.normal(size=(200, D))), 10 * R * np.sign(a)])
    logp = _log_density(points[None, :, :], clipped[:, None, :], b)  # (histories, points)
    ratio = logp[:, None, :] - logp[None, :, :]  # every pair, every point
    assert ratio.max() <= epsilon + 1e-9
    # Tight: the diametric pair reaches ε at the point beyond a on a's side.
    la, lc = logp[-2], logp[-1]
    assert (la - lc).max() == pytest.approx(epsilon, abs=1e-9)
    # And the bound is the geographic one: ε·‖e − e'‖₁/2R for each pair.
    dist = np.abs(clipped[:, None, :] - clipped[None, :, :]).sum(axis=-1)
    assert (ratio.max(axis=-1) <= epsilon * dist / (2 * R) + 1e-9).all()


def test_the_audit_catches_noise_too_small_for_the_declared_epsilon():
    a, c = _far_apart_histories()
    b = noise_scale(1.0, R) / 2  # the scale an R/ε device would use
    s = 10 * R * np.sign(a)
    assert _log_density(s, a, b) - _log_density(s, c, b) == pytest.approx(2.0)


def test_the_embedding_version_is_a_digest_of_the_factors_and_the_radius():
    v = embedding_version(FACTORS, R)
    assert len(v) == 64 and v == embedding_version(FACTORS.copy(), R)
    assert v != embedding_version(FACTORS, R * (1 + 1e-15))
    bumped = FACTORS.copy()
    bumped[3, 2] = np.nextafter(bumped[3, 2], np.inf)
    assert v != embedding_version(bumped, R)
