"""recsvc.multiselection.device: the device's Laplace noise from 53-bit words and its local choice,
exactly as docs/reference/client-bundle.md specifies them for every language."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from recsvc.checks import ParamError
from recsvc.multiselection import (
    clip_l1,
    device_signal,
    laplace_from_bits,
    laplace_noise,
    local_choice,
    noise_scale,
    uniform_from_bits,
)

TOP = (1 << 53) - 1


def test_uniform_from_bits_is_m_plus_one_over_two_to_the_53_never_zero() -> None:
    u = uniform_from_bits(np.array([0, 1, 1 << 52, TOP], dtype=np.uint64))
    assert u.tolist() == [2.0**-53, 2.0**-52, 0.5 + 2.0**-53, 1.0]
    with pytest.raises(ParamError, match="below 2\\*\\*53"):
        uniform_from_bits(np.array([1 << 53], dtype=np.uint64))


def test_laplace_from_bits_is_minus_log_u1_plus_log_u2() -> None:
    m = np.array([[0, TOP, 1 << 52], [TOP, 0, 1 << 52]], dtype=np.uint64)
    x = laplace_from_bits(m)
    assert x[0] == pytest.approx(53 * math.log(2), rel=1e-15)  # −ln 2⁻⁵³ + ln 1: the largest draw
    assert x[1] == pytest.approx(-53 * math.log(2), rel=1e-15)
    assert x[2] == 0.0
    assert np.isfinite(x).all()
    with pytest.raises(ParamError, match=r"shape \(2, \.\.\.\)"):
        laplace_from_bits(np.zeros((3, 4), dtype=np.uint64))


def test_laplace_noise_is_laplace_zero_one() -> None:
    x = laplace_noise((4, 5_000), np.random.default_rng(7)).ravel()
    assert x.shape == (20_000,)
    assert stats.kstest(x, stats.laplace.cdf).pvalue > 1e-3
    assert abs(x.mean()) < 0.05 and abs(np.abs(x).mean() - 1.0) < 0.03  # E|X| = 1, sd of the mean ≈ 0.007


def test_device_signal_is_the_clip_plus_the_scaled_bit_noise() -> None:
    e = np.array([3.0, -1.0, 0.5, 0.0])
    eps, radius = 0.7, 2.0
    got = device_signal(e, eps, radius, np.random.default_rng(3))
    want = clip_l1(e, radius) + noise_scale(eps, radius) * laplace_noise(4, np.random.default_rng(3))
    assert np.array_equal(got, want)


def test_local_choice_keeps_the_best_ties_to_the_earlier_item() -> None:
    assert local_choice([0.2, 0.9, 0.9, 0.1]) == 1
    assert local_choice([-np.inf, 0.3, 0.5]) == 2
    assert local_choice([-np.inf, -np.inf]) == 0  # every item seen: the server's first
    with pytest.raises(ParamError, match="non-empty 1-D"):
        local_choice([])
    with pytest.raises(ParamError, match="NaN"):
        local_choice([0.1, np.nan])
