"""The device's noise in one dimension: Laplace of scale 1/ε, and the geographic DP it gives
(docs/concepts/multi-selection.md).

A user with private value u ∈ ℝ sends the signal Z(u) = u + X, X ~ Laplace(0, 1/ε). The mechanism
u ↦ Z(u) is **ε-geographically DP**: for all u, u' and every measurable S ⊆ ℝ,

    P[Z(u) ∈ S] ≤ e^{ε|u − u'|} · P[Z(u') ∈ S].

Proof: the density of Z(u) is p_u(z) = (ε/2)·e^{−ε|z − u|}, so the pointwise log ratio is
log p_u(z) − log p_{u'}(z) = ε(|z − u'| − |z − u|) ≤ ε|u − u'| (triangle inequality), with
equality for every z on the far side of u from u'. Integrating p_u ≤ e^{ε|u−u'|}·p_{u'} over S
gives the definition. On a domain where |u − u'| ≤ Δ for all pairs this is ordinary (local)
εΔ-DP; geographic DP asks for less between near values and more between far ones.

The pointwise log ratio is a closed form, so the audit (:func:`geographic_excess`) is exact.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError, check_epsilon

Floats = npt.NDArray[np.float64]


def _epsilon(epsilon: object) -> float:
    return check_epsilon(epsilon, error=ParamError)


def laplace_scale(epsilon: float) -> float:
    """The noise scale b = 1/ε of ε-geographic DP: Theorem 1.4 of the source paper shows that no
    other noise gives the server a better multi-selection response."""
    return 1.0 / _epsilon(epsilon)


def signal_log_density(z: npt.ArrayLike, u: npt.ArrayLike, epsilon: float) -> Floats:
    """log p_u(z) = log(ε/2) − ε|z − u|, broadcast over ``z`` and ``u``."""
    eps = _epsilon(epsilon)
    z_, u_ = np.asarray(z, dtype=np.float64), np.asarray(u, dtype=np.float64)
    return np.asarray(np.log(eps / 2.0) - eps * np.abs(z_ - u_), dtype=np.float64)


def signal_cdf(z: npt.ArrayLike, u: npt.ArrayLike, epsilon: float) -> Floats:
    """P[Z(u) ≤ z], broadcast over ``z`` and ``u``."""
    eps = _epsilon(epsilon)
    t = eps * (np.asarray(z, dtype=np.float64) - np.asarray(u, dtype=np.float64))
    # Each branch evaluated where it is exact: e^{t} for t ≤ 0, 1 − e^{−t} for t > 0.
    return np.asarray(np.where(t <= 0, 0.5 * np.exp(np.minimum(t, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(t, 0.0))))


def sample_signal(u: npt.ArrayLike, epsilon: float, rng: np.random.Generator) -> Floats:
    """Z(u) = u + Laplace(0, 1/ε), one draw per element of ``u``. The device draws it; pass a
    CSPRNG (:func:`recsvc.rng.csprng`) when the signal leaves the device."""
    u_ = np.asarray(u, dtype=np.float64)
    return np.asarray(u_ + rng.laplace(0.0, laplace_scale(epsilon), size=u_.shape), dtype=np.float64)


def privacy_loss(z: npt.ArrayLike, u: npt.ArrayLike, u_prime: npt.ArrayLike, epsilon: float) -> Floats:
    """log p_u(z) − log p_{u'}(z) = ε(|z − u'| − |z − u|), broadcast over all three."""
    eps = _epsilon(epsilon)
    z_ = np.asarray(z, dtype=np.float64)
    u_, v_ = np.asarray(u, dtype=np.float64), np.asarray(u_prime, dtype=np.float64)
    return np.asarray(eps * (np.abs(z_ - v_) - np.abs(z_ - u_)), dtype=np.float64)


def geographic_excess(z: npt.ArrayLike, u: npt.ArrayLike, u_prime: npt.ArrayLike, epsilon: float) -> Floats:
    """The exact audit's statistic: privacy loss minus the allowance ε|u − u'|, broadcast over
    ``z``, ``u``, ``u_prime``. ε-geographic DP holds iff it is ≤ 0 everywhere (up to rounding);
    it is 0 wherever the bound is tight."""
    eps = _epsilon(epsilon)
    allowance = eps * np.abs(np.asarray(u, dtype=np.float64) - np.asarray(u_prime, dtype=np.float64))
    return np.asarray(privacy_loss(z, u, u_prime, eps) - allowance, dtype=np.float64)


def interval_log_ratio(
    lo: npt.ArrayLike, hi: npt.ArrayLike, u: npt.ArrayLike, u_prime: npt.ArrayLike, epsilon: float
) -> Floats:
    """log P[Z(u) ∈ (lo, hi]] − log P[Z(u') ∈ (lo, hi]], exact from the CDF: the definition's sets S
    for the intervals, broadcast over all arguments (lo < hi)."""
    lo_, hi_ = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    if np.any(lo_ >= hi_):
        raise ParamError("{lo} must be below {hi} in every interval")

    eps = _epsilon(epsilon)

    def mass(v: npt.ArrayLike) -> Floats:
        return _interval_mass(lo_, hi_, np.asarray(v, dtype=np.float64), eps)

    return np.asarray(np.log(mass(u)) - np.log(mass(u_prime)), dtype=np.float64)


def _interval_mass(lo: Floats, hi: Floats, u: Floats, eps: float) -> Floats:
    """P[Z(u) ∈ (lo, hi]] without the cancellation of a CDF difference in a tail: on one side of u
    it is a difference of two exponentials of the same sign, computed as e^{−near}·(1 − e^{−gap})."""
    t_lo, t_hi = eps * (lo - u), eps * (hi - u)
    right = 0.5 * np.exp(-np.maximum(t_lo, 0.0)) * -np.expm1(-(t_hi - t_lo))  # u ≤ lo
    left = 0.5 * np.exp(np.minimum(t_hi, 0.0)) * -np.expm1(-(t_hi - t_lo))  # hi ≤ u
    across = 1.0 - 0.5 * np.exp(np.minimum(t_lo, 0.0)) - 0.5 * np.exp(-np.maximum(t_hi, 0.0))
    return np.asarray(np.where(t_lo >= 0, right, np.where(t_hi <= 0, left, across)), dtype=np.float64)
