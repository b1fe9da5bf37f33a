"""The real quantities of clm's exact draw (:mod:`recsvc.mechanisms.clm_draw`): raw words as
uniforms and exact integers, rigorous float64 enclosures of the functions the Poisson processes
need, and the TAPE that records each quantity as a node (op, arguments, [lo, hi]) so that
:mod:`recsvc.mechanisms.clm_resolve` can evaluate it again on the reals.

Assumptions: libm's ``log``, ``exp``, ``log1p``, ``expm1`` within 4 ulps, and ``lgamma`` of an
integer within 2⁻⁴² relative (tests/mechanisms/test_mechanisms_clm_draw.py checks it against exact
binomials); every bound below is widened by far more than that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

# The decorator of helpers that take arrays and allocate none: compiled without reference counting
# (numba's ``_nrt`` target option, which its type stubs do not list), which would otherwise count
# every array argument on every call; a helper that allocated would not compile.
_NO_NRT: dict[str, Any] = {"_nrt": False}
_F = TypeVar("_F", bound=Callable[..., object])


def borrowing(fn: _F) -> _F:
    """``numba.njit(cache=True, nogil=True)`` without reference counting (see above)."""
    return cast("_F", numba.njit(cache=True, nogil=True, **_NO_NRT)(fn))  # a Dispatcher, called as fn


_LOG_TINY = -30.0  # below this log s, φ(s) = −log s to double precision (the next term is s/2)


class OutOfRandomness(Exception):
    """A kernel used up its block of raw draws (see :func:`_run`)."""


class TapeFull(Exception):
    """A kernel filled its tape (see :func:`_run`)."""


class Undecided(Exception):
    """A comparison the float enclosures cannot decide: its two nodes are in ``state[2:4]``."""


@borrowing
def _next_raw(raw: np.ndarray, cur: np.ndarray) -> np.uint64:  # pragma: no cover - numba
    i = cur[0]
    if i >= raw.shape[0]:
        raise OutOfRandomness()
    cur[0] = i + 1
    r: np.uint64 = raw[i]
    return r


@borrowing
def below(m: int, raw: np.ndarray, cur: np.ndarray) -> int:  # pragma: no cover - numba
    """Uniform on 0 … m − 1, exactly: a raw draw below 2⁶⁴ mod m is rejected, so the accepted
    ones cover every residue equally often."""
    mm = np.uint64(m)
    least = (np.uint64(0) - mm) % mm  # 2⁶⁴ mod m
    while True:
        r = _next_raw(raw, cur)
        if r >= least:
            return int(np.int64(r % mm))


# --- rigorous float enclosures ---------------------------------------------------------------------
# A real r approximated by a float x computed in a few roundings satisfies
# |x − r| ≤ (|x| + m)·_WIDEN, m = 0 for one correctly rounded operation (+, −, ×, log), m = 1 for a
# compound transcendental whose error is absolute near 0 (φ, log(e^z − 1), logaddexp). _WIDEN is
# 500 ulps: far above the roundings' sum, so the bounds hold with a margin; a comparison inside it
# is only sent to the slow path.
_WIDEN = 2.0**-44
_TINY = 2.0**-1060  # covers every float64 underflow
_NARROW = 1e-6  # an interval this narrow is bounded from one evaluation and a slope bound
_LGAMMA_REL = 2.0**-42  # lgamma of an integer (tests/mechanisms/test_mechanisms_clm_draw.py measures it)


@numba.njit(cache=True, nogil=True, inline="always")
def _dn(x: float, m: float) -> float:  # pragma: no cover - numba
    if x != x:
        return -math.inf
    if math.isinf(x):
        return x
    return x - ((abs(x) + m) * _WIDEN + _TINY)


@numba.njit(cache=True, nogil=True, inline="always")
def _up(x: float, m: float) -> float:  # pragma: no cover - numba
    if x != x:
        return math.inf
    if math.isinf(x):
        return x
    return x + ((abs(x) + m) * _WIDEN + _TINY)


@numba.njit(cache=True, nogil=True)
def phi(s: float) -> float:  # pragma: no cover - numba
    """φ(s) = −log(1 − e^{−s}) for s > 0 (its own inverse), in float64."""
    if s < 0.7:
        return -math.log(-math.expm1(-s))
    return -math.log1p(-math.exp(-s))


@numba.njit(cache=True, nogil=True)
def _phi_of_log_lo(x: float) -> float:  # pragma: no cover - numba
    """A lower bound of φ(e^x) (φ decreases: e^x rounded up)."""
    if x > 6.6:  # e^x > 735: 0 < φ
        return 0.0
    if x < _LOG_TINY:  # φ(s) ≥ −log s
        return -x
    return _dn(phi(_up(math.exp(x), 0.0)), 1.0)


@numba.njit(cache=True, nogil=True)
def _phi_of_log_hi(x: float) -> float:  # pragma: no cover - numba
    """An upper bound of φ(e^x)."""
    if x == -math.inf:
        return math.inf
    if x > 6.6:  # φ(s) ≤ 2e^{−s} < 10⁻³¹⁸ for s > 735
        return 1e-318
    if x < _LOG_TINY:  # φ(s) ≤ −log s + s for s ≤ 1
        return _up(-x + 2.0 * math.exp(x), 0.0)
    s = _dn(math.exp(x), 0.0)
    return math.inf if s <= 0.0 else _up(phi(s), 1.0)


@numba.njit(cache=True, nogil=True)
def _log_phi_lo(z: float) -> float:  # pragma: no cover - numba
    """A lower bound of log φ(z) for z > 0 (log φ decreases: z is its argument's upper bound)."""
    if z <= 0.0 or z == math.inf:
        return -math.inf
    if z > 30.0:  # φ(z) ≥ e^{−z}
        return -z
    return _dn(math.log(phi(z)), 1.0)


@numba.njit(cache=True, nogil=True)
def _log_phi_hi(z: float) -> float:  # pragma: no cover - numba
    if z <= 0.0:
        return math.inf
    if z > 30.0:  # φ(z) ≤ e^{−z}/(1 − e^{−z}), so log φ ≤ −z + 2e^{−z}
        return _up(-z + 2.0 * math.exp(-z), 0.0)
    return _up(math.log(phi(z)), 1.0)


@numba.njit(cache=True, nogil=True)
def _log_expm1_lo(z: float) -> float:  # pragma: no cover - numba
    """A lower bound of log(e^z − 1) for z > 0 (increasing)."""
    if z <= 0.0:
        return -math.inf
    if z > 40.0:  # log(e^z − 1) ≥ z − 2e^{−z}, far inside the widening
        return _dn(z, 0.0)
    if z > 0.7:
        return _dn(z + math.log(-math.expm1(-z)), 1.0)
    return _dn(math.log(math.expm1(z)), 1.0)


@numba.njit(cache=True, nogil=True)
def _log_expm1_hi(z: float) -> float:  # pragma: no cover - numba
    if z <= 0.0:
        return -math.inf
    if z > 40.0:  # log(e^z − 1) ≤ z
        return z
    if z > 0.7:
        return _up(z + math.log(-math.expm1(-z)), 1.0)
    return _up(math.log(math.expm1(z)), 1.0)


@numba.njit(cache=True, nogil=True)
def _logaddexp(x: float, y: float) -> float:  # pragma: no cover - numba
    hi, lo = (x, y) if x > y else (y, x)
    if lo == -math.inf or hi == math.inf:
        return hi
    return hi + math.log1p(math.exp(lo - hi))


@numba.njit(cache=True, nogil=True)
def lgamma_table(n: int) -> np.ndarray:  # pragma: no cover - numba
    """lgamma(i) for i = 0 … n + 1: the class sizes' terms, looked up instead of computed."""
    out = np.empty(n + 2)
    for i in range(n + 2):
        out[i] = math.lgamma(i)
    return out


@borrowing
def log_size(lg: np.ndarray, k: int, h: int, t: int) -> float:  # pragma: no cover - numba
    """log C(t − h − 2, k − h − 1): the size of class (h, t), in float64 (``lg``: lgamma_table)."""
    out: float = lg[t - h - 1] - lg[k - h] - lg[t - k]
    return out


@borrowing
def log_size_bounds(lg: np.ndarray, k: int, h: int, t: int) -> tuple[float, float]:  # pragma: no cover - numba
    g1, g2, g3 = lg[t - h - 1], lg[k - h], lg[t - k]
    slack = (g1 + g2 + g3 + 1.0) * _LGAMMA_REL + _TINY  # every lgamma of an integer ≥ 1 is ≥ 0
    mid = g1 - g2 - g3
    return mid - slack, mid + slack


@numba.njit(cache=True, nogil=True, inline="always")
def _mul_bounds(alo: float, ahi: float, blo: float, bhi: float) -> tuple[float, float]:  # pragma: no cover - numba
    p1, p2, p3, p4 = alo * blo, alo * bhi, ahi * blo, ahi * bhi
    return _dn(min(min(p1, p2), min(p3, p4)), 0.0), _up(max(max(p1, p2), max(p3, p4)), 0.0)


# The enclosure inputs: x_i = (xs_i − xs_0)·c with c = (ε/2)/Δmax, and γ, 1 − γ.
_C_LO, _C_HI, _G_LO, _G_HI, _G1_LO, _G1_HI = 0, 1, 2, 3, 4, 5


@numba.njit(cache=True, nogil=True)
def enclosure_inputs(epsilon: float, scale: float, gamma: float) -> np.ndarray:  # pragma: no cover - numba
    out = np.empty(6)
    c = (0.5 * epsilon) / scale
    out[_C_LO], out[_C_HI] = _dn(c, 0.0), _up(c, 0.0)
    out[_G_LO], out[_G_HI] = gamma, gamma
    out[_G1_LO], out[_G1_HI] = _dn(1.0 - gamma, 0.0), _up(1.0 - gamma, 0.0)
    return out


@borrowing
def _x_bounds(xs: np.ndarray, cx: np.ndarray, i: int) -> tuple[float, float]:  # pragma: no cover - numba
    diff = xs[i] - xs[0]
    return _mul_bounds(_dn(diff, 0.0), _up(diff, 0.0), cx[_C_LO], cx[_C_HI])


@borrowing
def util_bounds(xs: np.ndarray, cx: np.ndarray, h: int, t: int) -> tuple[float, float]:  # pragma: no cover - numba
    """Bounds of class (h, t)'s utility −(1 − γ)·x_h + γ·x_{t−1} (the top class: h = k − 1, t = k)."""
    xlo, xhi = _x_bounds(xs, cx, h)
    alo, ahi = _mul_bounds(cx[_G1_LO], cx[_G1_HI], -xhi, -xlo)
    xlo, xhi = _x_bounds(xs, cx, t - 1)
    blo, bhi = _mul_bounds(cx[_G_LO], cx[_G_HI], xlo, xhi)
    return _dn(alo + blo, 0.0), _up(ahi + bhi, 0.0)


# --- the tape --------------------------------------------------------------------------------------
# Node i: ops[i] = (op, arg0, arg1), vals[i] = (lo, hi, constant). Args are earlier nodes, or for
# the leaves a class (h, t), a count n, or a raw word's index j. clm_resolve.py evaluates the same
# ops in decimal; the numbers below are shared with it.
CONST, UTIL, LOG_SIZE, LOG_U, LOG_E, LOG_INT, ADD, SUB, PHI_OF_LOG, LOG_PHI, LOG_EXPM1, LOG_ADD_EXP = range(12)
N_NODES, DECISIONS, PENDING_X, PENDING_Y = 0, 1, 2, 3  # the state array's fields


@numba.njit(cache=True, nogil=True, inline="always")
def _node(
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, op: int, a0: int, a1: int, lo: float, hi: float, c: float
) -> int:  # pragma: no cover - numba
    i = state[N_NODES]
    if i >= ops.shape[0]:
        raise TapeFull()
    state[N_NODES] = i + 1
    ops[i, 0], ops[i, 1], ops[i, 2] = op, a0, a1
    vals[i, 0], vals[i, 1], vals[i, 2] = lo, hi, c
    return int(i)


@numba.njit(cache=True, nogil=True, inline="always")
def n_const(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, c: float) -> int:  # pragma: no cover - numba
    return _node(ops, vals, state, CONST, 0, 0, c, c, c)


@numba.njit(cache=True, nogil=True, inline="always")
def n_add(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, x: int, y: int) -> int:  # pragma: no cover - numba
    lo, hi = _dn(vals[x, 0] + vals[y, 0], 0.0), _up(vals[x, 1] + vals[y, 1], 0.0)
    return _node(ops, vals, state, ADD, x, y, lo, hi, 0.0)


@numba.njit(cache=True, nogil=True, inline="always")
def n_sub(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, x: int, y: int) -> int:  # pragma: no cover - numba
    lo, hi = _dn(vals[x, 0] - vals[y, 1], 0.0), _up(vals[x, 1] - vals[y, 0], 0.0)
    return _node(ops, vals, state, SUB, x, y, lo, hi, 0.0)


@borrowing
def n_phi_of_log(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, x: int) -> int:  # pragma: no cover - numba
    """φ(e^x) decreases with slope in [−1, 0]: on a narrow interval one evaluation at its top end
    bounds it (φ(e^{x_lo}) ≤ φ(e^{x_hi}) + width); elsewhere both ends are evaluated."""
    xlo, xhi = vals[x, 0], vals[x, 1]
    lo = _phi_of_log_lo(xhi)
    w = xhi - xlo
    if _LOG_TINY <= xhi <= 6.6 and w <= _NARROW:
        hi = _up(lo + w + (2.0 * abs(lo) + 6.0) * _WIDEN, 0.0)  # lo's own slack, twice, and the rounding of e^x
    else:
        hi = _phi_of_log_hi(xlo)
    return _node(ops, vals, state, PHI_OF_LOG, x, 0, lo, hi, 0.0)


@borrowing
def n_log_phi(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, x: int) -> int:  # pragma: no cover - numba
    """log φ decreases, |slope| = 1/((e^z − 1)·φ(z)), and (e^z − 1)·φ(z) = −w·ln w/(1 − w) with
    w = 1 − e^{−z} increases (its derivative's numerator −ln w − 1 + w ≥ 0), so the slope is
    steepest at the bottom end: on a narrow interval one evaluation there bounds it."""
    zlo, zhi = vals[x, 0], vals[x, 1]
    w = zhi - zlo
    if 0.0 < zlo <= 25.0 and w <= _NARROW:  # φ(25) ≈ 1.4·10⁻¹¹: far above its slack
        p = phi(zlo)
        lp = math.log(p)
        g = _dn(math.expm1(zlo), 0.0) * _dn(p, 1.0)  # below (e^z − 1)·φ(z)
        t = w / g if g > 0.0 else math.inf
        lo = _dn(lp - t - t * _WIDEN, 1.0)
        hi = _up(lp, 1.0)
    else:
        lo, hi = _log_phi_lo(zhi), _log_phi_hi(zlo)
    return _node(ops, vals, state, LOG_PHI, x, 0, lo, hi, 0.0)


@borrowing
def n_log_expm1(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, x: int) -> int:  # pragma: no cover - numba
    """log(e^z − 1) increases with slope 1/(1 − e^{−z}), largest at the interval's bottom end: on a
    narrow interval one evaluation there bounds it; elsewhere both ends are evaluated."""
    zlo, zhi = vals[x, 0], vals[x, 1]
    w = zhi - zlo
    if 0.0 < zlo <= 40.0 and w <= _NARROW:
        if zlo > 0.7:
            one_minus = -math.expm1(-zlo)  # 1 − e^{−z} > ½
            p = zlo + math.log(one_minus)
            slope = 1.0 / _dn(one_minus, 0.0)
        else:
            e = math.expm1(zlo)  # 1 − e^{−z} = e/(1 + e)
            p = math.log(e)
            small = _dn(e, 0.0)
            slope = 1.0 + 1.0 / small if small > 0.0 else math.inf
        t = w * slope
        lo, hi = _dn(p, 1.0), _up(p + t + (2.0 * (abs(p) + 1.0) + t) * _WIDEN, 0.0)
    else:
        lo, hi = _log_expm1_lo(zlo), _log_expm1_hi(zhi)
    return _node(ops, vals, state, LOG_EXPM1, x, 0, lo, hi, 0.0)


@borrowing
def n_log_add_exp(
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, x: int, y: int
) -> int:  # pragma: no cover - numba
    """Increasing, and log(e^{x+a} + e^{y+b}) ≤ log(e^x + e^y) + max(a, b): on narrow intervals one
    evaluation at the bottom ends bounds it."""
    p = _logaddexp(vals[x, 0], vals[y, 0])
    w = max(vals[x, 1] - vals[x, 0], vals[y, 1] - vals[y, 0])
    if w <= _NARROW and not math.isinf(p):
        hi = _up(p + w + 2.0 * (abs(p) + 1.0) * _WIDEN, 0.0)
    else:
        hi = _up(_logaddexp(vals[x, 1], vals[y, 1]), 1.0)
    return _node(ops, vals, state, LOG_ADD_EXP, x, y, _dn(p, 1.0), hi, 0.0)


@borrowing
def n_log_int(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, n: int) -> int:  # pragma: no cover - numba
    v = math.log(n)
    return _node(ops, vals, state, LOG_INT, n, 0, _dn(v, 0.0), _up(v, 0.0), 0.0)


@borrowing
def n_util(
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, xs: np.ndarray, cx: np.ndarray, h: int, t: int
) -> int:  # pragma: no cover - numba
    lo, hi = util_bounds(xs, cx, h, t)
    return _node(ops, vals, state, UTIL, h, t, lo, hi, 0.0)


@borrowing
def n_log_size(
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, lg: np.ndarray, k: int, h: int, t: int
) -> int:  # pragma: no cover - numba
    lo, hi = log_size_bounds(lg, k, h, t)
    return _node(ops, vals, state, LOG_SIZE, h, t, lo, hi, 0.0)


@borrowing
def _cell(raw: np.ndarray, j: int) -> tuple[float, float]:  # pragma: no cover - numba
    """U_j's first 53 bits: U_j ∈ [K·2⁻⁵³, (K + 1)·2⁻⁵³] (both ends exact floats)."""
    top = float(raw[j] >> np.uint64(11))
    return top * 2.0**-53, (top + 1.0) * 2.0**-53


@borrowing
def n_log_u(
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, raw: np.ndarray, cur: np.ndarray
) -> int:  # pragma: no cover - numba
    """log U_j of the next raw word j."""
    j = cur[0]
    _next_raw(raw, cur)
    ulo, uhi = _cell(raw, j)
    log_hi = math.log(uhi)
    # ln(uhi/ulo) = log1p(1/K) ≤ 1/K for the cell [K, K + 1]·2⁻⁵³: one log for both ends
    lo = -math.inf if ulo == 0.0 else _dn(log_hi - 2.0**-53 / ulo, 1.0)
    return _node(ops, vals, state, LOG_U, j, 0, lo, _up(log_hi, 0.0), 0.0)


@borrowing
def n_log_e(
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, raw: np.ndarray, cur: np.ndarray
) -> int:  # pragma: no cover - numba
    """log E_j, E_j = −log U_j of the next raw word j: a standard exponential's logarithm."""
    j = cur[0]
    _next_raw(raw, cur)
    ulo, uhi = _cell(raw, j)
    log_hi = math.log(uhi)
    e_lo = -_up(log_hi, 0.0)  # ≤ 0 only in the top cell: then log E's lower bound is −∞
    if e_lo <= 0.0 or ulo == 0.0:
        e_hi = math.inf if ulo == 0.0 else -_dn(math.log(ulo), 0.0)
        lo = -math.inf if e_lo <= 0.0 else _dn(math.log(e_lo), 0.0)
        return _node(ops, vals, state, LOG_E, j, 0, lo, _up(math.log(e_hi), 0.0), 0.0)
    # E ≤ −ln uhi + 1/K (as in n_log_u), and log E_hi ≤ log E_lo + (E_hi − E_lo)/E_lo: two logs, not four
    e_hi = _up(-_dn(log_hi, 0.0) + 2.0**-53 / ulo, 0.0)
    log_lo = math.log(e_lo)  # |log E| ≤ 37 here: its 4 ulps are inside the absolute slack
    hi = _up(log_lo + (e_hi - e_lo) / e_lo + 2.0 * (abs(log_lo) + 1.0) * _WIDEN, 0.0)
    return _node(ops, vals, state, LOG_E, j, 0, _dn(log_lo, 1.0), hi, 0.0)


@numba.njit(cache=True, nogil=True, inline="always")
def less(
    vals: np.ndarray, state: np.ndarray, forced: np.ndarray, slack: float, x: int, y: int
) -> bool:  # pragma: no cover - numba
    """Whether node x < node y on the reals: by the enclosures when they are apart (by more than
    ``slack``: tests set it to ∞ to send every comparison to the slow path), else by the next
    decision in ``forced``, else :class:`Undecided`."""
    if vals[x, 1] + slack < vals[y, 0]:
        return True
    if vals[x, 0] - slack >= vals[y, 1]:
        return False
    i = state[DECISIONS]
    state[DECISIONS] = i + 1
    if i < forced.shape[0]:
        return bool(forced[i])
    state[PENDING_X], state[PENDING_Y] = x, y
    raise Undecided()


@dataclass(frozen=True)
class Tape:
    """The nodes a draw computed (:mod:`recsvc.mechanisms.clm_resolve` reads them)."""

    ops: npt.NDArray[np.int64]
    vals: npt.NDArray[np.float64]

    @staticmethod
    def of(size: int) -> Tape:
        return Tape(np.empty((size, 3), np.int64), np.empty((size, 3)))


@dataclass(frozen=True)
class Inputs:
    """What the tape's leaves are about, for the slow path: the sorted scores, ε, the sensitivities
    (their largest is Δmax), γ and k."""

    xs: np.ndarray
    epsilon: float
    d: np.ndarray
    gamma: float
    k: int


@numba.njit(cache=True, nogil=True)
def class_utilities(  # pragma: no cover - numba
    x_sorted: np.ndarray, k: int, gamma: float, epsilon: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """In float64, for the split policy: a[h] (k,) nondecreasing in h and b[t] (n + 1,)
    nonincreasing in t on k + 1 … n, class (h, t)'s utility a[h] + b[t]; and the top class's
    (a = b = x_[k])."""
    n = x_sorted.shape[0]
    c = 0.5 * epsilon
    a = np.empty(k)
    b = np.empty(n + 1)  # b[t] for t ≤ k is never read
    for h in range(k):  # loops, not slice arithmetic: several times faster for numba to compile
        a[h] = -c * (1.0 - gamma) * x_sorted[h]
    for t in range(k + 1, n + 1):
        b[t] = c * gamma * x_sorted[t - 1]
    return a, b, -c * (1.0 - 2.0 * gamma) * x_sorted[k - 1]


@numba.njit(cache=True, nogil=True)
def strictly_decreasing(xs: np.ndarray) -> bool:  # pragma: no cover - numba
    """Distinct values sorted descending (False on NaN)."""
    for i in range(1, xs.shape[0]):  # noqa: SIM110  # a loop numba compiles, unlike all() of a generator
        if not xs[i] < xs[i - 1]:
            return False
    return True
