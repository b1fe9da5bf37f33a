"""The exponential race's float check, compiled, for :class:`~recsvc.mechanisms.exact_race.GapUtilities`
(``rnm``, ``oneshot``, ``clm`` at k = 1): v̂_i = fl(fl(q_i − top)·c) − fl(ln x_i), the leaders and
the first value behind them, and for the top k the leaders' rigorous bounds
(:mod:`recsvc.mechanisms.exact_race`'s module docstring, ``_lower`` and ``_upper``).

**Screen.** A cell's uniform x_i ∈ [2^{E−1023}, 2^{E−1022}) (E its biased exponent) has
−ln x_i ≤ (1023 − E)·ln 2, so v̂_i ≤ â_i + (1023 − E)·ln 2 up to a few roundings; a candidate whose
bound plus the slack ``_SLACK``·(|â_i| + 1024) is below the value it would have to beat (the
runner-up, or the (k+1)-th) cannot change any leader or that value, and skips its ``log``. The
slack covers ``log``'s 4 ulps of |ln x| ≤ 745 and the bound's two roundings many times over. With
every â ≤ 0 the top k skips most cells on their bits alone, one integer comparison (``_skip_bits``).
A cell at 0 (v̂ = inf) is never skipped. The kernels return what the unscreened pass returns.
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
_FLAT = 2.0**-30  # ≥ _SLACK·1024: the slack of any â ≤ 0
_NEVER = np.uint64(2**64 - 1)  # above every float64's bits


def gap_scale(epsilon: float, m: float, d_max: float, spread: float) -> tuple[float, float]:
    """:class:`~recsvc.mechanisms.exact_race.GapUtilities`' c and err for ε, m, Δmax and the score
    range max q − min q: c = ε/(m·Δmax) shrunk by 16u, and err the bound on what it leaves out (a
    subnormal ε/(m·Δmax) has no relative bound: its absolute error times the range covers it).
    Plain float arithmetic, so the compiled rows (:func:`exponential_gap_rows`) get the same numbers."""
    c_hat = (epsilon / m) / d_max
    err = _TINY + (spread * 2.0**-1070 if c_hat < 2.0**-1000 else 0.0)
    return c_hat * (1.0 - 16.0 * _U), err


def upper_error(err: float, noise_error: float, magnitude: float, b_max: float) -> float:
    """E with v_j ≤ v̂_j + 1.01u·|v̂_j| + E for v̂ = fl(value + fl(b·sup)), for utilities within
    ``err`` and a noise within ``noise_error`` of magnitude at most ``magnitude``."""
    return err + b_max * (noise_error + 1.01 * _U * magnitude) + _TINY


_gap_scale = numba.njit(cache=True, nogil=True)(gap_scale)
_upper_error = numba.njit(cache=True, nogil=True)(upper_error)


@numba.njit(cache=True, nogil=True)
def _bound(a: float, bits: np.uint64) -> float:  # pragma: no cover - numba
    """An upper bound of fl(a − fl(ln x)) less the slack, for x > 0 with these bits."""
    e = 1023 - int(bits >> np.uint64(52))
    return a + e * _LN2_UP + _SLACK * (abs(a) + 1024.0)


@numba.njit(cache=True, nogil=True)
def _skip_bits(threshold: float) -> np.uint64:  # pragma: no cover - numba
    """The least bits of a cell whose every value â + (1023 − E)·ln 2 + slack is below
    ``threshold`` for any â ≤ 0 (a :class:`GapUtilities` value): its exponent e = 1023 − E has
    e·ln 2 + 2⁻³⁰ < threshold (the slack at â ≤ 0 is at most 2⁻⁴⁰·1024), so every larger cell
    (a smaller e) is below it too; ``_NEVER`` when no e ≥ 1 is."""
    if not threshold > _LN2_UP + _FLAT:  # also NaN
        return _NEVER
    e = min(int((threshold - _FLAT) / _LN2_UP), 1022) if threshold < 1e4 else 1022  # inf: every e
    while e >= 1 and not e * _LN2_UP + _FLAT < threshold:
        e -= 1
    if e < 1:
        return _NEVER
    return np.uint64(1023 - e) << np.uint64(52)


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
    bounds decide them: in order if ``ordered``, else as a set. 1 ≤ k < n; ``shift`` ≥ max q (so
    every â ≤ 0), which lets a cell be skipped on its bits alone (``_skip_bits``)."""
    idx = np.empty(k + 1, np.int64)
    val = np.full(k + 1, -math.inf)
    filled = 0
    skip = _NEVER  # bits ≥ skip: the cell's bound alone is below val[k]
    for i in range(q.shape[0]):
        if bits[i] >= skip:
            continue
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
        if filled == k + 1:
            skip = _skip_bits(val[k])
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


@numba.njit(cache=True, nogil=True)
def exponential_gap_rows(
    q: np.ndarray,
    d: np.ndarray,
    lengths: np.ndarray,
    epsilons: np.ndarray,
    m: float,
    noise_error: float,
    magnitude: float,
    x: np.ndarray,
    bits: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """:func:`exponential_top_k` at k = 1 on each row of a ragged batch: row b is the gap race of
    q_b at ε_b (its own max q, min q and max Δ, :func:`gap_scale`) on the next n_b cells of x; a
    row of one candidate takes no cell and picks it. Each row's leader, and whether its float
    bounds decide it."""
    rows = lengths.shape[0]
    idx = np.zeros(rows, np.int64)
    ok = np.ones(rows, np.bool_)
    s, cell = 0, 0
    for b in range(rows):
        n = lengths[b]
        if n > 1:
            top, bottom, d_max = q[s], q[s], d[s]
            for i in range(s, s + n):
                top = max(top, q[i])
                bottom = min(bottom, q[i])
                d_max = max(d_max, d[i])
            c, err = _gap_scale(epsilons[b], m, d_max, top - bottom)
            e_up = _upper_error(err, noise_error, magnitude, 1.0)
            got, decided = exponential_top_k(
                q[s : s + n], top, c, err, noise_error, e_up, x[cell : cell + n], bits[cell : cell + n], 1, True
            )
            idx[b], ok[b] = got[0], decided
            cell += n
        s += n
    return idx, ok
