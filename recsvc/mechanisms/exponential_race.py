"""The exponential race's float check, compiled, for :class:`~recsvc.mechanisms.exact_race.GapUtilities`
(``rnm``, ``oneshot``, ``clm`` at k = 1): v̂_i = fl(fl(q_i − top)·c) − fl(ln x_i), the leaders and
the first value behind them, and for the top k the leaders' rigorous bounds
(:mod:`recsvc.mechanisms.exact_race`'s module docstring, ``_lower`` and ``_upper``).

**Screen.** A cell's uniform x_i ∈ [2^{E−1023}, 2^{E−1022}) (E its biased exponent) has
−ln x_i ≤ (1023 − E)·ln 2, so v̂_i ≤ â_i + (1023 − E)·ln 2 up to a few roundings; a candidate whose
bound plus the slack ``_SLACK``·(|â_i| + 1024) is below the value it would have to beat (the
runner-up, or the (k+1)-th) cannot change any leader or that value, and skips its ``log``. The
slack covers ``log``'s 4 ulps of |ln x| ≤ 745 and the bound's two roundings many times over. A cell
at 0 (v̂ = inf) is never skipped. The kernels return what the unscreened pass returns.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF

_U = UNIT_ROUNDOFF
_CELL = 2.0**-53  # rng.random() is k·2⁻⁵³: its real uniform lies in [x, x + 2⁻⁵³)
_TINY = 2.0**-1060  # as exact_race's bounds
_LN2_UP = 0.6931471805599454  # > ln 2
_SLACK = 2.0**-40


@numba.njit(cache=True, nogil=True)
def _bound(a: float, bits: np.uint64) -> float:  # pragma: no cover - numba
    """An upper bound of fl(a − fl(ln x)) less the slack, for x > 0 with these bits."""
    e = 1023 - int(bits >> np.uint64(52))
    return a + e * _LN2_UP + _SLACK * (abs(a) + 1024.0)


@numba.njit(cache=True, nogil=True)
def exponential_leaders(
    q: np.ndarray, shift: float, c: float, x: np.ndarray, bits: np.ndarray
) -> tuple[int, float, float]:  # pragma: no cover - numba
    """The first argmax of v̂, its v̂ and the runner-up's v̂ (a tie makes them equal: undecided);
    ``bits`` is x viewed as uint64."""
    top, v_top, second = 0, -math.inf, -math.inf
    for i in range(q.shape[0]):
        a = (q[i] - shift) * c
        if x[i] > 0.0:
            if _bound(a, bits[i]) < second:
                continue
            v = a - math.log(x[i])
        else:
            v = math.inf
        if v > v_top:
            top, v_top, second = i, v, v_top
        elif v > second:
            second = v
    return top, v_top, second


@numba.njit(cache=True, nogil=True)
def exponential_top_k(
    q: np.ndarray,
    shift: float,
    c: float,
    err: float,
    noise_error: float,
    e_up: float,
    x: np.ndarray,
    bits: np.ndarray,
    k: int,
    ordered: bool,
) -> tuple[np.ndarray, bool]:  # pragma: no cover - numba
    """The k largest v̂ by decreasing v̂ (the lower index first on a tie), and whether the float
    bounds decide them: in order if ``ordered``, else as a set. 1 ≤ k < n."""
    idx = np.empty(k + 1, np.int64)
    val = np.full(k + 1, -math.inf)
    filled = 0
    for i in range(q.shape[0]):
        a = (q[i] - shift) * c
        if x[i] > 0.0:
            if filled == k + 1 and _bound(a, bits[i]) < val[k]:
                continue
            v = a - math.log(x[i])
        else:
            v = math.inf
        if filled == k + 1 and not v > val[k]:
            continue
        j = filled if filled < k + 1 else k
        while j > 0 and v > val[j - 1]:
            val[j], idx[j] = val[j - 1], idx[j - 1]
            j -= 1
        val[j], idx[j] = v, i
        if filled < k + 1:
            filled += 1
    lo = np.empty(k)
    for r in range(k):
        t = idx[r]
        z = -math.log(x[t] + _CELL)
        if not math.isfinite(z):
            lo[r] = -math.inf
            continue
        la = (q[t] - shift) * c * (1.0 + 40.0 * _U) - err
        lo[r] = la + (z - noise_error) - 3.0 * _U * (abs(la) + (abs(z) + noise_error)) - _TINY
    hi = np.empty(k + 1)
    for r in range(k + 1):
        v = val[r]
        hi[r] = v if v == -math.inf else v + 1.01 * _U * abs(v) + e_up
    if ordered:
        ok = True
        for r in range(k):
            if not lo[r] > hi[r + 1]:
                ok = False
    else:
        ok = lo.min() > hi[k]
    return idx[:k].copy(), ok
