"""The float64 clm subset sampler that the exact one replaced (recsvc/mechanisms/clm_draw.py at
27640e1, verbatim below this paragraph), kept for side-by-side benchmarks only: it thins in
float64, so its law is not the proven one. ``draw_slate`` is the entry point.

clm's winning class drawn (in float64) by touching only the classes that can win.

:func:`recsvc.mechanisms.clm.clm_top_k` needs the class with the largest value u_c + N_c, where
u_c is the class's utility and N_c the best of its m_c Exponential(1) noises. Drawing one N_c per
class costs a uniform and five transcendental passes over all k(n − k) + 1 classes (10⁷ for a
top-500 of 20,720 items). This module draws the same maximum from Poisson processes instead.

The best of m Exponential(1) values shifted by u has P(V < v) = (1 − e^{u−v})^m = e^{−m·φ(v−u)},
φ(z) = −log(1 − e^{−z}): it is the largest point of a Poisson process on the line whose mass above
v is m·φ(v − u). The classes' processes are independent, so the largest point of their union is
the maximum and its owner the winning class. The classes are cells of a rectangle (h, t); over a
sub-rectangle R the utility is at most ū_R (largest h, smallest t) and the size at most m̄_R
(smallest h, largest t), so every cell's process is a thinning of the DOMINATING process with mass
|R|·m̄_R·φ(v − ū_R) above v, whose points are easy to draw from the top down (mass Γ_i, the sum of
i Exponential(1), sits at ū_R + φ(Γ_i / (|R| m̄_R)); φ is its own inverse). A heap holds each
rectangle's next point; the highest is either thinned (a uniform cell of R keeps it with
probability λ_c(v)/λ̄_R(v), the ratio of the intensities m/(e^{v−u} − 1)), or R is split in two and
the point handed to the half holding its (uniform) cell, kept with the ratio of the halves' and
R's intensities, while each half continues below v from its own dominating mass. The first point
kept by a cell is the largest point of the union: the winner, with exactly the law of the
exhaustive draw. Rectangles whose bounds are loose are split before thinning, so the work is a
few hundred heap steps where the exhaustive draw takes millions of classes.

One numba call draws the class, the members and their order (:func:`draw_slate`). It reads a block
of the generator's raw 64-bit draws rather than the generator itself (numba's unboxing of a
Generator costs more than a whole draw at n = 500, k = 10); a call that runs out of them restarts
on the same draws followed by fresh ones (:func:`_with_raw`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numba
import numpy as np
import numpy.typing as npt

_LOG_TINY = -30.0  # below this log s, φ(s) = −log s to double precision (the next term is s/2)
_T = TypeVar("_T")
_TIGHT = 1.0  # split a rectangle whose log intensity can vary by more than this across its cells


@dataclass(frozen=True)
class Classes:
    """The class rectangle of sorted scores: utilities a[h] + b[t] (0 ≤ h < k < t ≤ n, 1-based t)
    and log sizes lnC(t − h − 2, k − h − 1); the top class is drawn separately."""

    a: np.ndarray  # (k,) nondecreasing in h
    b: np.ndarray  # (n + 1,) nonincreasing in t on k + 1 … n
    k: int
    n: int


def classes_of(x_sorted: np.ndarray, k: int, gamma: float, epsilon: float) -> Classes:
    """The utilities −(ε/2)·loss of :func:`recsvc.mechanisms.clm.classes` as a[h] + b[t]."""
    a, b, _ = _class_utilities(x_sorted, k, gamma, epsilon)
    return Classes(a, b, k, x_sorted.shape[0])


@numba.njit(cache=True, nogil=True)
def _class_utilities(  # pragma: no cover - numba
    x_sorted: np.ndarray, k: int, gamma: float, epsilon: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """(a, b, the top class's utility): :class:`Classes`' arrays; the top class has a = b = x_[k]."""
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


class OutOfRandomness(Exception):
    """A kernel used up its block of raw draws (see :func:`_with_raw`)."""


@numba.njit(cache=True, nogil=True)
def _next_raw(raw: np.ndarray, cur: np.ndarray) -> np.uint64:  # pragma: no cover - numba
    i = cur[0]
    if i >= raw.shape[0]:
        raise OutOfRandomness()
    cur[0] = i + 1
    r: np.uint64 = raw[i]
    return r


@numba.njit(cache=True, nogil=True)
def _uniform(raw: np.ndarray, cur: np.ndarray) -> float:  # pragma: no cover - numba
    """Uniform on (0, 1] from the top 53 bits: 1 − numpy's ``random()``, whose law it has."""
    return float((_next_raw(raw, cur) >> np.uint64(11)) + np.uint64(1)) * 2.0**-53


@numba.njit(cache=True, nogil=True)
def _exponential(raw: np.ndarray, cur: np.ndarray) -> float:  # pragma: no cover - numba
    return -math.log(_uniform(raw, cur))


@numba.njit(cache=True, nogil=True)
def _below(m: int, raw: np.ndarray, cur: np.ndarray) -> int:  # pragma: no cover - numba
    """Uniform on 0 … m − 1, exactly: a raw draw below 2⁶⁴ mod m is rejected, so the accepted
    ones cover every residue equally often."""
    mm = np.uint64(m)
    least = (np.uint64(0) - mm) % mm  # 2⁶⁴ mod m
    while True:
        r = _next_raw(raw, cur)
        if r >= least:
            return int(r % mm)


@numba.njit(cache=True, nogil=True)
def phi(s: float) -> float:  # pragma: no cover - numba
    """φ(s) = −log(1 − e^{−s}) for s > 0 (its own inverse)."""
    if s < 0.7:
        return -math.log(-math.expm1(-s))
    return -math.log1p(-math.exp(-s))


@numba.njit(cache=True, nogil=True)
def _phi_of_log(log_s: float) -> float:  # pragma: no cover - numba
    """φ(e^{log s}) without overflow or underflow."""
    if log_s < _LOG_TINY:
        return -log_s
    if log_s > 6.6:  # s > 735: e^{−s} underflows, φ(s) = e^{−s} is 0 to double precision
        return 0.0
    return phi(math.exp(log_s))


@numba.njit(cache=True, nogil=True)
def _log_phi(z: float) -> float:  # pragma: no cover - numba
    """log φ(z) for z > 0."""
    if z > 30.0:  # φ(z) = e^{−z}(1 + e^{−z}/2 + …)
        return -z
    return math.log(phi(z))


@numba.njit(cache=True, nogil=True)
def _log_expm1(z: float) -> float:  # pragma: no cover - numba
    return z + math.log(-math.expm1(-z)) if z > 0.7 else math.log(math.expm1(z))


@numba.njit(cache=True, nogil=True)
def _log_intensity_gap(v: float, u_hi: float, u: float) -> float:  # pragma: no cover - numba
    """log[(e^{v−u_hi} − 1)/(e^{v−u} − 1)] ≤ 0 for u ≤ u_hi < v: the intensity ratio's utility part."""
    return _log_expm1(v - u_hi) - _log_expm1(v - u)


@numba.njit(cache=True, nogil=True)
def _logaddexp(x: float, y: float) -> float:  # pragma: no cover - numba
    if x == -math.inf:
        return y
    hi, lo = (x, y) if x > y else (y, x)
    return hi + math.log1p(math.exp(lo - hi))


@numba.njit(cache=True, nogil=True)
def _log_size(k: int, h: int, t: int) -> float:  # pragma: no cover - numba
    """log C(t − h − 2, k − h − 1): the size of class (h, t)."""
    return math.lgamma(t - h - 1) - math.lgamma(k - h) - math.lgamma(t - k)


# A rectangle of classes is a row of two arrays: its cell bounds h0, h1, t0, t1 (int) and its
# floats: the largest utility of a cell, the largest log size, log(cells · largest size) (the
# dominating process's mass scale), log Γ of its current point (the dominating mass above it) and
# that point.
_H0, _H1, _T0, _T1 = 0, 1, 2, 3
_U_HI, _LOG_M_HI, _LOG_MASS, _LOG_GAMMA, _V = 0, 1, 2, 3, 4


@numba.njit(cache=True, nogil=True)
def _new_rect(  # pragma: no cover - numba
    a: np.ndarray, b: np.ndarray, k: int, ints: np.ndarray, floats: np.ndarray, h0: int, h1: int, t0: int, t1: int
) -> None:
    ints[0], ints[1], ints[2], ints[3] = h0, h1, t0, t1
    log_m = _log_size(k, h0, t1)
    floats[_U_HI] = a[h1] + b[t0]
    floats[_LOG_M_HI] = log_m
    floats[_LOG_MASS] = math.log((h1 - h0 + 1) * (t1 - t0 + 1)) + log_m
    floats[_LOG_GAMMA] = -math.inf
    floats[_V] = math.inf


@numba.njit(cache=True, nogil=True)
def _advance(floats: np.ndarray, e: float) -> None:  # pragma: no cover - numba
    """Move a rectangle to its next point below: Γ ← Γ + e."""
    floats[_LOG_GAMMA] = _logaddexp(floats[_LOG_GAMMA], math.log(e))
    floats[_V] = floats[_U_HI] + _phi_of_log(floats[_LOG_GAMMA] - floats[_LOG_MASS])


@numba.njit(cache=True, nogil=True)
def _looseness(  # pragma: no cover - numba
    a: np.ndarray, b: np.ndarray, k: int, ints: np.ndarray, floats: np.ndarray
) -> tuple[float, float]:
    """How much the log intensity can vary across a rectangle's h range and across its t range."""
    h0, h1, t0, t1 = ints[0], ints[1], ints[2], ints[3]
    along_h = (floats[_LOG_M_HI] - _log_size(k, h1, t1)) + (a[h1] - a[h0])
    along_t = (floats[_LOG_M_HI] - _log_size(k, h0, t0)) + (b[t0] - b[t1])
    return along_h, along_t


@numba.njit(cache=True, nogil=True)
def _higher(floats: np.ndarray, i: int, j: int) -> bool:  # pragma: no cover - numba
    """Row i's point comes before row j's: higher, or as high and an earlier row."""
    vi, vj = floats[i, _V], floats[j, _V]
    return vi > vj or (vi == vj and i < j)


@numba.njit(cache=True, nogil=True)
def _push(heap: np.ndarray, size: int, floats: np.ndarray, row: int) -> None:  # pragma: no cover - numba
    """Put ``row`` into the binary heap heap[:size] (which has room for it)."""
    i = size
    heap[i] = row
    while i:
        parent = (i - 1) // 2
        if not _higher(floats, heap[i], heap[parent]):
            return
        heap[i], heap[parent] = heap[parent], heap[i]
        i = parent


@numba.njit(cache=True, nogil=True)
def _pop(heap: np.ndarray, size: int, floats: np.ndarray) -> int:  # pragma: no cover - numba
    """Take the first row out of the binary heap heap[:size] (leaving size − 1 rows)."""
    first: int = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        best, left = i, 2 * i + 1
        if left < size and _higher(floats, heap[left], heap[best]):
            best = left
        if left + 1 < size and _higher(floats, heap[left + 1], heap[best]):
            best = left + 1
        if best == i:
            return first
        heap[i], heap[best] = heap[best], heap[i]
        i = best


@numba.njit(cache=True, nogil=True)
def _winning_class(  # pragma: no cover - numba
    a: np.ndarray, b: np.ndarray, k: int, n: int, top_util: float, raw: np.ndarray, cur: np.ndarray
) -> tuple[int, int]:
    """:func:`winning_class` on the arrays of :class:`Classes`. Row 0 is the top class (one class
    of one subset), row 1 the whole rectangle; a heap of rows, each in it at most once, orders
    their current points."""
    cap = 64
    ints = np.empty((cap, 4), np.int64)
    floats = np.empty((cap, 5))
    heap = np.empty(cap, np.int64)
    ints[0, 0], ints[0, 1], ints[0, 2], ints[0, 3] = k - 1, k - 1, k, k
    floats[0, _U_HI], floats[0, _LOG_M_HI], floats[0, _LOG_MASS] = top_util, 0.0, 0.0
    floats[0, _LOG_GAMMA], floats[0, _V] = -math.inf, math.inf
    _advance(floats[0], _exponential(raw, cur))
    _push(heap, 0, floats, 0)
    rows = size = 1
    if n > k:
        _new_rect(a, b, k, ints[1], floats[1], 0, k - 1, k + 1, n)
        _advance(floats[1], _exponential(raw, cur))
        _push(heap, size, floats, 1)
        rows = size = 2
    while True:
        r = _pop(heap, size, floats)
        size -= 1
        if r == 0:
            return k - 1, k
        h0, h1, t0, t1 = ints[r, 0], ints[r, 1], ints[r, 2], ints[r, 3]
        cells = (h1 - h0 + 1) * (t1 - t0 + 1)
        if cells == 1:
            return h0, t0
        v = floats[r, _V]
        along_h, along_t = _looseness(a, b, k, ints[r], floats[r])
        if along_h + along_t > _TIGHT:
            # split: the point goes to the half holding its uniform cell, kept with the ratio of
            # the half's intensity to r's; each half goes on below v from its own mass
            if rows + 2 > cap:
                cap *= 2
                ints = np.concatenate((ints, np.empty_like(ints)))
                floats = np.concatenate((floats, np.empty_like(floats)))
                heap = np.concatenate((heap, np.empty_like(heap)))
            lo, hi = rows, rows + 1
            rows += 2
            if t1 > t0 and (along_t >= along_h or h1 == h0):
                mid = (t0 + t1) // 2
                _new_rect(a, b, k, ints[lo], floats[lo], h0, h1, t0, mid)
                _new_rect(a, b, k, ints[hi], floats[hi], h0, h1, mid + 1, t1)
            else:
                mid = (h0 + h1) // 2
                _new_rect(a, b, k, ints[lo], floats[lo], h0, mid, t0, t1)
                _new_rect(a, b, k, ints[hi], floats[hi], mid + 1, h1, t0, t1)
            cell = _below(cells, raw, cur)
            lo_cells = (ints[lo, 1] - ints[lo, 0] + 1) * (ints[lo, 3] - ints[lo, 2] + 1)
            holder = lo if cell < lo_cells else hi
            for half in (lo, hi):
                f = floats[half]
                f[_LOG_GAMMA] = f[_LOG_MASS] + _log_phi(v - f[_U_HI])  # its mass above v
                keep = False
                if half == holder:
                    log_keep = f[_LOG_M_HI] - floats[r, _LOG_M_HI] + _log_intensity_gap(v, floats[r, _U_HI], f[_U_HI])
                    keep = math.log(_uniform(raw, cur)) < log_keep
                if keep:
                    f[_V] = v
                else:
                    _advance(f, _exponential(raw, cur))
                _push(heap, size, floats, half)
                size += 1
            continue
        # thin: a uniform cell keeps the point with the ratio of its intensity to the bound
        cell = _below(cells, raw, cur)
        width = t1 - t0 + 1
        h, t = h0 + cell // width, t0 + cell % width
        log_keep = _log_size(k, h, t) - floats[r, _LOG_M_HI] + _log_intensity_gap(v, floats[r, _U_HI], a[h] + b[t])
        if math.log(_uniform(raw, cur)) < log_keep:
            return h, t
        _advance(floats[r], _exponential(raw, cur))
        _push(heap, size, floats, r)
        size += 1


@numba.njit(cache=True, nogil=True)
def _class_kernel(  # pragma: no cover - numba
    a: np.ndarray, b: np.ndarray, k: int, n: int, top_util: float, raw: np.ndarray
) -> tuple[int, int]:
    return _winning_class(a, b, k, n, top_util, raw, np.zeros(1, np.int64))


@numba.njit(cache=True, nogil=True)
def _slate_kernel(  # pragma: no cover - numba
    q: np.ndarray,
    d: np.ndarray,
    xs: np.ndarray,
    order: np.ndarray,
    k: int,
    epsilon: float,
    gamma: float,
    raw: np.ndarray,
) -> np.ndarray:
    """clm's k-subset of scores q with sensitivities d (``xs``: q sorted descending): the winning
    class of the utilities of (xs − xs[0])·(ε/2)/Δmax, then a uniform member in uniformly random
    order: the head j_1..j_h, k − h − 1 of the pool j_{h+2}..j_{t−1} (a partial Fisher–Yates shuffle) and the tail j_t (the top class:
    j_1..j_k). Ranks come from ``order`` (the stable descending order) or, when it is empty (the
    scores are distinct), from the values: the head is q ≥ x_[h], the pool x_[t] < q < x_[h+1] and
    the tail q = x_[t], one pass over q instead of an argsort."""
    n = q.shape[0]
    scale = d[0]
    for i in range(1, n):
        scale = max(scale, d[i])
    x = np.empty(n)
    unit = 0.5 * epsilon / scale  # in utility units, the top score subtracted first (clm.centred_units)
    for i in range(n):
        x[i] = (xs[i] - xs[0]) * unit
    a, b, top_util = _class_utilities(x, k, gamma, 2.0)
    cur = np.zeros(1, np.int64)
    h, t = _winning_class(a, b, k, n, top_util, raw, cur)
    out = np.empty(k, np.int64)
    top = t == k
    pool = np.empty(0 if top else t - h - 2, np.int64)
    if order.shape[0]:
        for i in range(k if top else h):
            out[i] = order[i]
        if not top:
            for i in range(pool.shape[0]):
                pool[i] = order[h + 1 + i]
            out[k - 1] = order[t - 1]
    else:
        head_least = xs[k - 1] if top else (xs[h - 1] if h else math.inf)
        hi, lo = xs[h], xs[t - 1]
        i_head = i_pool = 0
        for i in range(n):
            v = q[i]
            if v >= head_least:
                out[i_head] = i
                i_head += 1
            elif top:
                continue
            elif lo < v < hi:
                pool[i_pool] = i
                i_pool += 1
            elif v == lo:
                out[k - 1] = i
    if t != k:
        body = k - h - 1
        for j in range(body):  # pool[:body] becomes a uniform body
            m = j + _below(pool.shape[0] - j, raw, cur)
            pool[j], pool[m] = pool[m], pool[j]
            out[h + j] = pool[j]
    for j in range(k - 1, 0, -1):  # a uniform order of the set
        m = _below(j + 1, raw, cur)
        out[j], out[m] = out[m], out[j]
    return out


# Raw 64-bit draws first given to a kernel: the members and their order take up to 2k − 1, the
# class a few per heap step; enough for all but a few per cent of the draws measured at ε ≤ 10
# (n = 500 and 20,720; k = 10 and 500).
RAW_PER_ITEM, RAW_FOR_CLASS = 3, 128


def _with_raw(rng: np.random.Generator, block: int, kernel: Callable[..., _T], *args: object) -> _T:
    """kernel(*args, raw) on ``block`` of ``rng``'s raw 64-bit draws. The kernel's output is a
    function of the raw sequence; a kernel that runs out restarts on the same draws followed by
    fresh ones, so the output has the law of one run on an unending sequence."""
    bits = rng.bit_generator
    raw = bits.random_raw(block)
    while True:
        try:
            return kernel(*args, raw)
        except OutOfRandomness:
            raw = np.concatenate((raw, bits.random_raw(raw.shape[0])))


def winning_class(cl: Classes, top_util: float, rng: np.random.Generator) -> tuple[int, int]:
    """(h, t) of the class with the largest u + N (the top class as (k − 1, k)), drawn exactly."""
    h, t = _with_raw(rng, RAW_FOR_CLASS, _class_kernel, cl.a, cl.b, cl.k, cl.n, top_util)
    return int(h), int(t)


def draw_slate(
    q: np.ndarray,
    d: np.ndarray,
    xs: np.ndarray,
    order: np.ndarray,
    k: int,
    epsilon: float,
    gamma: float,
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    """clm's k-subset in uniformly random order: a uniform member of the winning class. ``xs``:
    q's values sorted descending; ``order``: q's stable descending order, or empty if the scores
    are distinct (the members are then found by value)."""
    block = RAW_FOR_CLASS + RAW_PER_ITEM * k
    return _with_raw(rng, block, _slate_kernel, q, d, xs, order, k, epsilon, gamma)
