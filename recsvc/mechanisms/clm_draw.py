"""clm's winning class drawn exactly by touching only the classes that can win.

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
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

_LOG_TINY = -30.0  # below this log s, φ(s) = −log s to double precision (the next term is s/2)
_TIGHT = 1.0  # split a rectangle whose log intensity can vary by more than this across its cells


@dataclass(frozen=True)
class Classes:
    """The class rectangle of sorted scores: utilities a[h] + b[t] (0 ≤ h < k < t ≤ n, 1-based t)
    and log sizes lnC(t − h − 2, k − h − 1); the top class is drawn separately."""

    a: np.ndarray  # (k,) nondecreasing in h
    b: np.ndarray  # (n + 1,) nonincreasing in t on k + 1 … n
    k: int
    n: int

    def log_size(self, h: int, t: int) -> float:
        return math.lgamma(t - h - 1) - math.lgamma(self.k - h) - math.lgamma(t - self.k)

    def util(self, h: int, t: int) -> float:
        return float(self.a[h] + self.b[t])


def classes_of(x_sorted: np.ndarray, k: int, gamma: float, epsilon: float) -> Classes:
    """The utilities −(ε/2)·loss of :func:`recsvc.mechanisms.clm.classes` as a[h] + b[t]."""
    n = x_sorted.shape[0]
    c = 0.5 * epsilon
    b = np.full(n + 1, np.inf)  # b[t] for t ≤ k is never read
    b[k + 1 :] = c * gamma * x_sorted[k:]
    return Classes(-c * (1.0 - gamma) * x_sorted[:k], b, k, n)


def phi(s: float) -> float:
    """φ(s) = −log(1 − e^{−s}) for s > 0 (its own inverse)."""
    if s < 0.7:
        return -math.log(-math.expm1(-s))
    return -math.log1p(-math.exp(-s))


def _phi_of_log(log_s: float) -> float:
    """φ(e^{log s}) without overflow or underflow."""
    if log_s < _LOG_TINY:
        return -log_s
    if log_s > 6.6:  # s > 735: e^{−s} underflows, φ(s) = e^{−s} is 0 to double precision
        return 0.0
    return phi(math.exp(log_s))


def _log_phi(z: float) -> float:
    """log φ(z) for z > 0."""
    if z > 30.0:  # φ(z) = e^{−z}(1 + e^{−z}/2 + …)
        return -z
    return math.log(phi(z))


def _log_intensity_gap(v: float, u_hi: float, u: float) -> float:
    """log[(e^{v−u_hi} − 1)/(e^{v−u} − 1)] ≤ 0 for u ≤ u_hi < v: the intensity ratio's utility part."""
    return _log_expm1(v - u_hi) - _log_expm1(v - u)


def _log_expm1(z: float) -> float:
    return z + math.log(-math.expm1(-z)) if z > 0.7 else math.log(math.expm1(z))


@dataclass
class _Rect:
    h0: int
    h1: int
    t0: int
    t1: int
    u_hi: float  # the largest utility of a cell
    log_m_hi: float  # the largest log size of a cell
    log_mass: float  # log(cells · m̄): the dominating process's mass scale
    log_gamma: float = -math.inf  # log Γ of the current point (the dominating mass above it)
    v: float = math.inf  # the current point

    @property
    def cells(self) -> int:
        return (self.h1 - self.h0 + 1) * (self.t1 - self.t0 + 1)


def _rect(cl: Classes, h0: int, h1: int, t0: int, t1: int) -> _Rect:
    log_m = cl.log_size(h0, t1)
    cells = (h1 - h0 + 1) * (t1 - t0 + 1)
    return _Rect(h0, h1, t0, t1, cl.util(h1, t0), log_m, math.log(cells) + log_m)


def _advance(r: _Rect, e: float) -> None:
    """Move r to its next point below: Γ ← Γ + e."""
    r.log_gamma = math.log(e) if r.log_gamma == -math.inf else float(np.logaddexp(r.log_gamma, math.log(e)))
    r.v = r.u_hi + _phi_of_log(r.log_gamma - r.log_mass)


def _looseness(cl: Classes, r: _Rect) -> tuple[float, float]:
    """How much the log intensity can vary across r's h range and across its t range."""
    along_h = (r.log_m_hi - cl.log_size(r.h1, r.t1)) + (cl.a[r.h1] - cl.a[r.h0])
    along_t = (r.log_m_hi - cl.log_size(r.h0, r.t0)) + (cl.b[r.t0] - cl.b[r.t1])
    return float(along_h), float(along_t)


def _split(cl: Classes, r: _Rect) -> tuple[_Rect, _Rect]:
    along_h, along_t = _looseness(cl, r)
    if r.t1 > r.t0 and (along_t >= along_h or r.h1 == r.h0):
        mid = (r.t0 + r.t1) // 2
        return _rect(cl, r.h0, r.h1, r.t0, mid), _rect(cl, r.h0, r.h1, mid + 1, r.t1)
    mid = (r.h0 + r.h1) // 2
    return _rect(cl, r.h0, mid, r.t0, r.t1), _rect(cl, mid + 1, r.h1, r.t0, r.t1)


def winning_class(cl: Classes, top_util: float, rng: np.random.Generator) -> tuple[int, int]:
    """(h, t) of the class with the largest u + N (the top class as (k − 1, k)), drawn exactly."""
    k, n = cl.k, cl.n
    top = _Rect(k - 1, k - 1, k, k, top_util, 0.0, 0.0)  # one class of one subset
    _advance(top, float(rng.standard_exponential()))
    heap: list[tuple[float, int, _Rect]] = [(-top.v, 0, top)]
    if n > k:
        whole = _rect(cl, 0, k - 1, k + 1, n)
        _advance(whole, float(rng.standard_exponential()))
        heap.append((-whole.v, 1, whole))
        heapq.heapify(heap)
    serial = 2
    while True:
        _, _, r = heapq.heappop(heap)
        if r is top:
            return k - 1, k
        v = r.v
        if r.cells == 1:
            return r.h0, r.t0
        if sum(_looseness(cl, r)) > _TIGHT:
            # split: the point goes to the half holding its uniform cell, kept with the ratio of
            # the half's intensity to r's; each half goes on below v from its own mass
            halves = _split(cl, r)
            cell = int(rng.integers(r.cells))
            holder = halves[0] if cell < halves[0].cells else halves[1]
            for half in halves:
                half.log_gamma = half.log_mass + _log_phi(v - half.u_hi)  # its mass above v
                keep = False
                if half is holder:
                    log_keep = half.log_m_hi - r.log_m_hi + _log_intensity_gap(v, r.u_hi, half.u_hi)
                    keep = math.log(rng.random()) < log_keep
                if keep:
                    half.v = v
                else:
                    _advance_from(half, float(rng.standard_exponential()))
                heapq.heappush(heap, (-half.v, serial, half))
                serial += 1
            continue
        # thin: a uniform cell keeps the point with the ratio of its intensity to the bound
        cell = int(rng.integers(r.cells))
        width = r.t1 - r.t0 + 1
        h, t = r.h0 + cell // width, r.t0 + cell % width
        log_keep = cl.log_size(h, t) - r.log_m_hi + _log_intensity_gap(v, r.u_hi, cl.util(h, t))
        if math.log(rng.random()) < log_keep:
            return h, t
        _advance_from(r, float(rng.standard_exponential()))
        heapq.heappush(heap, (-r.v, serial, r))
        serial += 1


def _advance_from(r: _Rect, e: float) -> None:
    """Move r from its current mass log Γ to its next point below: Γ ← Γ + e."""
    r.log_gamma = float(np.logaddexp(r.log_gamma, math.log(e)))
    r.v = r.u_hi + _phi_of_log(r.log_gamma - r.log_mass)
