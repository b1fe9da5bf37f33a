"""Generalised exponential mechanism family: gem, mgem (paper §IV-C/D), combined_gem (§VII).

GEM (Raskhodnikova & Smith 2015) with s_a = q_a − tΔ_a normalises the scores to::

    q'_a = min_{a'} (s_a − s_{a'}) / (Δ_a + Δ_{a'})      (≤ 0; the a' = a term is 0)

Each term moves by at most 1 between neighbours (|q_a − q'_a| ≤ Δ_a), so q' has sensitivity 1
and ``rnm`` on q' with Δmax = 1 is ε-DP; t only depends on public n, β, ε.

q'_a is the smallest slope from the point Q_a = (Δ_a, s_a) to the points P_{a'} = (−Δ_{a'}, s_{a'}).
Every P lies left of every Q, so the minimum is attained at the tangent from Q_a to the UPPER
convex hull of the P's: we build the hull once (O(n log n)) and binary-search each tangent
(O(log n)), in a numba kernel with O(n) memory — never the O(n²) matrix. Before the sort, an
O(n) Akl–Toussaint pass drops the points that cannot be hull vertices, so typically only a small
share of the n points is sorted (the sort dominated at full-catalog sizes, n ≈ 20,000).

Scores are ALREADY CLIPPED by the caller; inputs are validated.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import cast

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact import exponential_noisy_max_expectation, exponential_noisy_max_log_probabilities
from recsvc.mechanisms.exact_race import EXPONENTIAL, Enclosure, race_argmax, widen
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.mechanisms.exact_sampling import decimal_context, exact_bernoulli
from recsvc.mechanisms.params import ParamSpec, ParamValues
from recsvc.mechanisms.privacy import Split, Stage
from recsvc.mechanisms.validation import MechanismInputError
from recsvc.stats import argsort_fast, argsort_float, spearman, spearman_sorted

BETA = ParamSpec("beta", 0.05, 0.0, 1.0, "GEM failure probability β in t = 2 ln(n/β)/ε")
CORR_BUDGET_FRACTION = ParamSpec(
    "corr_budget_fraction", 0.6, 0.0, 1.0, "share c of ε spent on combined_gem's correlation bit (ε_c = cε)"
)


@numba.njit(cache=True, nogil=True)
def _hull_candidates(s: np.ndarray, d: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """Indices of the points (−Δ, s) on or above the polyline L → T → R through the leftmost
    (highest), the highest and the rightmost (highest) point. Every upper-hull vertex is among
    them (the upper hull is concave through L, T and R, so it lies above both chords); a small
    relative tolerance keeps points that rounding might put just below a chord."""
    n = s.shape[0]
    il = ir = it = 0
    for i in range(n):
        if d[i] > d[il] or (d[i] == d[il] and s[i] > s[il]):
            il = i
        if d[i] < d[ir] or (d[i] == d[ir] and s[i] > s[ir]):
            ir = i
        if s[i] > s[it]:
            it = i
    xl, yl, xt, yt, xr, yr = -d[il], s[il], -d[it], s[it], -d[ir], s[ir]
    keep = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        x = -d[i]
        y = s[i]
        if x <= xt:
            a = (xt - xl) * (y - yl)
            b = (yt - yl) * (x - xl)
        else:
            a = (xr - xt) * (y - yt)
            b = (yr - yt) * (x - xt)
        if a - b >= -1e-12 * (abs(a) + abs(b)):
            keep[m] = i
            m += 1
    return keep[:m]


@numba.njit(cache=True, nogil=True)
def upper_hull(s: np.ndarray, d: np.ndarray, order: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """The vertices (indices, by x ascending) of the upper hull of the points (x, y) = (−Δ, s)
    listed in ``order`` (those that may be hull vertices, sorted by x ascending; equal x: the
    highest wins, whatever their order)."""
    c = order.shape[0]
    hx = np.empty(c)
    hy = np.empty(c)
    hv = np.empty(c, np.int64)
    h = 0
    i = 0
    while i < c:
        v = order[i]
        x = -d[v]
        j = i + 1
        while j < c and -d[order[j]] == x:  # same x: keep the highest point only
            if s[order[j]] > s[v]:
                v = order[j]
            j += 1
        i = j
        y = s[v]
        # Monotone chain, upper hull: drop the last vertex while it is not a strict right turn.
        while h >= 2 and (hx[h - 1] - hx[h - 2]) * (y - hy[h - 2]) - (hy[h - 1] - hy[h - 2]) * (x - hx[h - 2]) >= 0:
            h -= 1
        hx[h] = x
        hy[h] = y
        hv[h] = v
        h += 1
    return hv[:h]


@numba.njit(cache=True, nogil=True)
def hull_at(
    s: np.ndarray, d: np.ndarray, vertices: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """The hull through ``vertices`` (by x ascending): their x = −Δ and y = s, and the slope of
    each edge j → j + 1. A shear (y + c·x, as a change of t makes) keeps the same vertices."""
    h = vertices.shape[0]
    hx = np.empty(h)
    hy = np.empty(h)
    for j in range(h):
        hx[j] = -d[vertices[j]]
        hy[j] = s[vertices[j]]
    edge = np.empty(max(h - 1, 0))
    for j in range(h - 1):
        edge[j] = (hy[j + 1] - hy[j]) / (hx[j + 1] - hx[j])
    return hx, hy, edge


@numba.njit(cache=True, nogil=True)
def tangents(
    hx: np.ndarray, hy: np.ndarray, edge: np.ndarray, x: np.ndarray, y: np.ndarray
) -> np.ndarray:  # pragma: no cover - numba
    """min(0, the smallest slope from each Q = (x_a, y_a) to a vertex of the hull (hx, hy) with
    edge slopes ``edge``): q'_a for Q_a = (Δ_a, s_a)."""
    h = hx.shape[0]
    out = np.empty(x.shape[0])
    for a in range(x.shape[0]):
        qa_x = x[a]
        qa_y = y[a]
        # g(j) = slope from hull vertex j to Q_a is unimodal along the hull: binary search.
        # Q_a lies right of every vertex, so g(j + 1) < g(j) iff edge j is steeper than g(j):
        # edge[j]·(x_Q − x_j) > y_Q − y_j, one multiplication instead of two divisions.
        lo = 0
        hi = h - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if edge[mid] * (qa_x - hx[mid]) > qa_y - hy[mid]:
                lo = mid + 1
            else:
                hi = mid
        best = (qa_y - hy[lo]) / (qa_x - hx[lo])
        # guard against rounding at a flat stretch of the hull
        if lo > 0:
            best = min(best, (qa_y - hy[lo - 1]) / (qa_x - hx[lo - 1]))
        if lo + 1 < h:
            best = min(best, (qa_y - hy[lo + 1]) / (qa_x - hx[lo + 1]))
        out[a] = min(best, 0.0)  # the a' = a term is exactly 0
    return out


@numba.njit(cache=True, nogil=True)
def hull_vertices(s: np.ndarray, d: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """The upper hull's vertices of the points (−Δ, s), by x ascending."""
    cand = _hull_candidates(s, d)
    return upper_hull(s, d, cand[argsort_float(-d[cand])])


@numba.njit(cache=True, nogil=True)
def hull(s: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """The upper hull of the points (−Δ, s): :func:`hull_at` its vertices."""
    return hull_at(s, d, hull_vertices(s, d))


def q_prime(q: np.ndarray, d: np.ndarray, t: float) -> np.ndarray:
    """GEM normalised scores q'_a = min_{a'} ((q_a − tΔ_a) − (q_{a'} − tΔ_{a'}))/(Δ_a + Δ_{a'}).

    O(n log n) time and O(n) memory (upper-hull tangents). Equals :func:`q_prime_naive`.
    """
    s = np.ascontiguousarray(q - t * d)
    d = np.ascontiguousarray(d, dtype=np.float64)
    hx, hy, edge = hull(s, d)
    return tangents(hx, hy, edge, d, s)


def q_prime_naive(q: np.ndarray, d: np.ndarray, t: float) -> npt.NDArray[np.float64]:
    """The O(n²)-memory definition of q': what the tests and scripts.bench.mechanisms hold q_prime to."""
    s = q - t * d
    q_p = ((s[:, None] - s[None, :]) / (d[:, None] + d[None, :])).min(axis=1)
    return cast("npt.NDArray[np.float64]", q_p)  # numpy types a reduction along an axis as Any


def gem_t(n: int, epsilon: float, beta: float) -> float:
    """t = 2 ln(n/β)/ε (GEM); mGEM uses −t."""
    return 2.0 * math.log(n / beta) / epsilon


# |s| = |q − tΔ| and every |s_i − s_j|/(Δ_i + Δ_j) must stay below the largest double (≈ 1.8e308).
_MAX_SCALED = 1e307


def checked_t(q: np.ndarray, d: np.ndarray, epsilon: float, beta: float) -> float:
    """GEM's t, with an O(n) guarantee that q' is finite for ±t (t·Δ overflows only for ε near
    the smallest doubles); runs before any randomness is drawn."""
    t = gem_t(q.shape[0], epsilon, beta)
    with np.errstate(over="ignore", invalid="ignore"):
        s_max = float(np.abs(q).max()) + abs(t) * float(d.max())
        bound = s_max / float(d.min())  # ≥ every |q'_i| = |min_j (s_i − s_j)/(Δ_i + Δ_j)|
    if not (s_max < _MAX_SCALED and bound < _MAX_SCALED):
        raise MechanismInputError(
            f"epsilon={epsilon!r} is too small for the GEM family with these sensitivities: "
            f"t·Δ = 2·ln(n/β)·Δ/ε overflows a double; expected a larger epsilon"
        )
    return t


def _gem_u(q: np.ndarray, d: np.ndarray, epsilon: float, t: float) -> npt.NDArray[np.float64]:
    """rnm's utilities on q' for an already checked, signed t (+t: gem, −t: mgem)."""
    qp = q_prime(q, d, t)
    # rnm with Δmax = 1: noise mean 2/ε (numpy types qp.max() as Any, and so the difference)
    return cast("npt.NDArray[np.float64]", (qp - qp.max()) * (epsilon / 2.0))


class GemUtilities:
    """The race's a_i = q'_i·ε/2 on the real numbers: s = q − tΔ for the float t (any
    data-independent t keeps q' of sensitivity 1, so the proof is about this t), and the real min
    over a' of (s_a − s_a')/(Δ_a + Δ_a') (max q' = 0 exactly: the top s has every term ≥ 0).

    Bounds. The hull's q̂'_a is one float term (a, a') or the exact 0 (:func:`tangents`), so the
    real q'_a is at most that real term. A float term is within 4.02u·R + 3.02u·|term| of the real
    one, R = max|q|/min Δ + |t| ≥ (|q_a| + |t|Δ_a)/Δ_a (ŝ's two roundings in the numerator, the
    sum and the division). ``value`` = q̂'·(ε/2)(1 − 6u) and ``err`` = 4.1u·R·ε/2 (R is itself rounded) bound a from
    above; ``lower`` takes the min of every float term from a (an O(n) pass, for the leaders
    only); ``exact`` computes in decimal the terms the float bounds cannot rule out of the min."""

    __slots__ = ("d", "epsilon", "err", "n", "q", "r_bound", "s", "t", "value")

    def __init__(
        self,
        q: np.ndarray,
        d: np.ndarray,
        epsilon: float,
        t: float,
        s: np.ndarray | None = None,
    ) -> None:
        """``s`` = q − tΔ when the caller has it."""
        self.q, self.d, self.epsilon, self.t, self.n = q, d, epsilon, t, q.shape[0]
        self.s = np.ascontiguousarray(q - t * d) if s is None else s
        d = np.ascontiguousarray(d, dtype=np.float64)
        hx, hy, edge = hull(self.s, d)
        qp = tangents(hx, hy, edge, d, self.s)
        self.value: npt.NDArray[np.float64] = qp * (epsilon * 0.5 * (1.0 - 6.0 * _U))
        self.r_bound = float(np.abs(q).max()) / float(d.min()) + abs(t)
        self.err = 4.1 * _U * self.r_bound * epsilon * 0.5 * (1.0 + 4.0 * _U) + 2.0**-1060

    def _terms(self, i: int) -> npt.NDArray[np.float64]:
        terms: npt.NDArray[np.float64] = (self.s[i] - self.s) / (self.d[i] + self.d)
        return terms

    def lower(self, i: int) -> float:
        m = min(float(self._terms(i).min()), 0.0)
        low = m * (1.0 + 3.02 * _U) - 4.1 * _U * self.r_bound
        return low * (self.epsilon * 0.5) * (1.0 + 4.0 * _U) - 2.0**-1060

    def exact(self, idx: Sequence[int], prec: int) -> list[Enclosure]:
        """Decimal enclosures of a_idx. At P digits each s is within (|q| + |tΔ|)·10^{1−P}, so a
        term is within 10^{2−P}·(2R + |term|) whatever the cancellation; ×ε/2 is rounded outwards."""
        big = prec + 10
        ctx, slack_ctx = decimal_context(big), decimal_context(8, decimal.ROUND_CEILING)
        down, up = decimal_context(prec, decimal.ROUND_FLOOR), decimal_context(prec, decimal.ROUND_CEILING)
        t, eps, two_r = Decimal(self.t), Decimal(self.epsilon), Decimal(2.02 * self.r_bound)
        out = []
        for i in idx:
            best = Decimal(0)  # the a' = a term, exact
            s_i = ctx.subtract(Decimal(float(self.q[i])), ctx.multiply(t, Decimal(float(self.d[i]))))
            for j in self._near(i).tolist():
                s_j = ctx.subtract(Decimal(float(self.q[j])), ctx.multiply(t, Decimal(float(self.d[j]))))
                gap = ctx.add(Decimal(float(self.d[i])), Decimal(float(self.d[j])))
                best = min(best, ctx.divide(ctx.subtract(s_i, s_j), gap))
            slack = slack_ctx.multiply(Decimal(10) ** (2 - big), slack_ctx.add(two_r, abs(best)))
            lo, hi = down.subtract(best, slack), up.add(best, slack)
            out.append((down.divide(down.multiply(lo, eps), 2), up.divide(up.multiply(hi, eps), 2)))
        return out

    def _near(self, i: int) -> npt.NDArray[np.intp]:
        """The a' whose float term is within both error bands of the float min: the real min of
        the terms is attained among them (every other term is certainly larger)."""
        terms = self._terms(i)
        band = 4.1 * _U * self.r_bound
        m = min(float(terms.min()), 0.0)
        return np.flatnonzero(terms - 3.03 * _U * np.abs(terms) - band <= m + 3.03 * _U * abs(m) + band)


def _gem_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, t: float, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """rnm on q' with Δmax = 1 for an already checked, signed t, sampled exactly (exact_race)."""
    return race_argmax(GemUtilities(q, d, epsilon, t), EXPONENTIAL, rng, size)


def gem_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> np.ndarray:
    """GEM: t = 2 ln(n/β)/ε, then rnm on q' with Δmax = 1 (Exponential noise of mean 2/ε),
    sampled exactly on the real q' (:class:`GemUtilities`, :mod:`recsvc.mechanisms.exact_race`).

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a: q' has sensitivity 1 (Raskhodnikova & Smith 2015).
    """
    return _gem_sample(q, d, epsilon, checked_t(q, d, epsilon, p["beta"]), rng, size)


def gem_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> np.ndarray:
    return exponential_noisy_max_log_probabilities(_gem_u(q, d, epsilon, checked_t(q, d, epsilon, p["beta"])))


def gem_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    return exponential_noisy_max_expectation(_gem_u(q, d, epsilon, checked_t(q, d, epsilon, p["beta"])), values)


def mgem_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> np.ndarray:
    """Modified GEM: as ``gem`` with t = −2 ln(n/β)/ε (favours high-Δ candidates), sampled exactly.

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a: the sensitivity-1 argument holds for any
    data-independent t.
    """
    return _gem_sample(q, d, epsilon, -checked_t(q, d, epsilon, p["beta"]), rng, size)


def mgem_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> np.ndarray:
    return exponential_noisy_max_log_probabilities(_gem_u(q, d, epsilon, -checked_t(q, d, epsilon, p["beta"])))


def mgem_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    return exponential_noisy_max_expectation(_gem_u(q, d, epsilon, -checked_t(q, d, epsilon, p["beta"])), values)


def correlation_bit(q: np.ndarray, d: np.ndarray, d_order: np.ndarray | None = None) -> int:
    """b = [spearman(q, Δ) ≥ 0]; an undefined Spearman (constant input, or n = 1) counts as 0.
    ``d_order``: a sort of Δ, for a caller that shares one Δ among many q (a batch)."""
    if q.shape[0] < 2:
        return 1  # 0 ≥ 0
    if d_order is None:
        return int(spearman(q, d, undefined=0.0) >= 0.0)
    return int(spearman_sorted(q, d, argsort_fast(q), d_order) >= 0.0)


def correlation_split(p: Mapping[str, float]) -> Split:
    """Combined GEM's budget: ε_c = cε on the correlation bit, ε_g = ε − ε_c on the selection."""
    return _correlation_split(p["corr_budget_fraction"])


@functools.lru_cache(maxsize=256)  # each draw splits ε twice (bit, then selection): build the Split once
def _correlation_split(c: float) -> Split:
    return Split(
        (Stage("corr_budget_fraction·epsilon"), Stage("(1 − corr_budget_fraction)·epsilon")),
        (c,),
        "corr_budget_fraction",
    )


def reported_bit_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> tuple[float, float]:
    """(log P(reported bit = 0), log P(reported bit = 1)) under binary RR with ε_c = cε."""
    eps_c, _ = correlation_split(p).stage_epsilons(epsilon)
    log_keep = -math.log1p(math.exp(-eps_c))  # log e^{ε_c}/(1 + e^{ε_c})
    log_flip = -eps_c + log_keep
    return (log_flip, log_keep) if correlation_bit(q, d) else (log_keep, log_flip)


@functools.lru_cache(maxsize=256)  # one decimal exp per (ε_c, precision), not one per draw
def _keep_bounds(eps_c: float, prec: int) -> tuple[Decimal, Decimal]:
    """Bounds of P(keep) = 1/(1 + e^{−ε_c}): three correctly rounded operations."""
    ctx = decimal_context(prec)
    keep = ctx.divide(1, ctx.add(1, ctx.exp(-Decimal(eps_c))))
    return widen(keep, prec)


@functools.lru_cache(maxsize=256)  # the same bounds object per ε_c: exact_bernoulli caches its thresholds
def keep_bounds(eps_c: float) -> Callable[[int], tuple[Decimal, Decimal]]:
    """RR's P(keep) = 1/(1 + e^{−ε_c}) as :func:`recsvc.mechanisms.exact_sampling.exact_bernoulli` takes it."""
    return functools.partial(_keep_bounds, eps_c)


def report_correlation_bit(
    q: np.ndarray,
    d: np.ndarray,
    epsilon: float,
    p: ParamValues,
    rng: np.random.Generator,
    size: int,
    d_order: np.ndarray | None = None,
) -> np.ndarray:
    """``size`` independent reports of b = [spearman(q, Δ) ≥ 0] by binary randomised response:
    keep b with probability e^{ε_c}/(1 + e^{ε_c}), ε_c = cε, as an exact Bernoulli trial on a
    lazily drawn uniform (:func:`recsvc.mechanisms.exact_sampling.exact_bernoulli`); ``d_order``
    as in :func:`correlation_bit`. Privacy: ε_c-DP for any input."""
    eps_c, _ = correlation_split(p).stage_epsilons(epsilon)
    keep = exact_bernoulli(keep_bounds(eps_c), rng, size)
    b = correlation_bit(q, d, d_order)
    return np.where(keep, b, 1 - b)


def combined_gem_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> np.ndarray:
    _, eps_g = correlation_split(p).stage_epsilons(epsilon)
    log_b0, log_b1 = reported_bit_log_probabilities(q, d, epsilon, p)
    return np.logaddexp(log_b1 + mgem_log_probabilities(q, d, eps_g, p), log_b0 + gem_log_probabilities(q, d, eps_g, p))


def combined_gem_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    """The mixture of :func:`combined_gem_log_probabilities`, as an expectation."""
    _, eps_g = correlation_split(p).stage_epsilons(epsilon)
    log_b0, log_b1 = reported_bit_log_probabilities(q, d, epsilon, p)
    return math.exp(log_b1) * mgem_expectation(q, d, eps_g, p, values) + math.exp(log_b0) * gem_expectation(
        q, d, eps_g, p, values
    )
