"""``gumbel``'s slate sampled exactly, as k exponential-mechanism draws without replacement.

The ordered top k of x + G (G_a i.i.d. standard Gumbel, x = (q − q*)·ε/(2kΔmax)) has the
Plackett–Luce law: item a first with probability e^{x_a}/Σ e^{x}, then the next among those left
in the same way (docs/concepts/privacy-proofs.md#gumbel; the tests check it against quadrature of
the Gumbel densities). Each step is therefore an exponential-mechanism draw, and is sampled here
as :mod:`recsvc.mechanisms.exact_sampling` samples ``em``: a lazily drawn real uniform U against
rigorously bounded cumulative weights, with the :mod:`decimal` slow path when the 64-bit prefix
of U is not decided by float64.

The weights are computed once; a step removes the chosen item by subtracting its weight from the
cumulative sums that follow it (a sorted list of at most k − 1 removals), so each step after the
first costs O(log n + k), not O(n), in one compiled loop over the steps (:func:`_steps`). Error bounds, with u = 2⁻⁵³, R the relative and A the absolute
bound of ``em``'s :func:`~recsvc.mechanisms.exact_sampling._em_error` on every float cumulative
sum (the weights' and the removed ones'):
the float difference D_i of the two sums is within 2R·(Ŝ_i + Ŵ_i) + 3A of the exact remaining
cumulative weight (the factor 2 covers the difference's own rounding and these bounds' arithmetic,
since R ≥ 40u). When the remaining mass falls below 2⁻²⁴ of the computed total, the weights are
recomputed from the items left, so the bounds stay tight relative to what is being sampled.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.mechanisms.exact_sampling import _em_error, _em_slow, em_exact_sample, uniform_words
from recsvc.mechanisms.privacy import at_most

_REBUILD = 2.0**-24  # recompute the weights when the mass left is below this share of theirs


@functools.lru_cache(maxsize=1024)  # a few (ε, k) per service; Fraction is slow
def step_epsilon(epsilon: float, k: int) -> float:
    """The largest float ε′ ≤ ε/k: k steps at ε′ consume at most ε, exactly (not up to a rounding)."""
    return at_most(epsilon / k, Fraction(epsilon), k)


_DONE, _SLOW, _REBUILD_NOW = 0, 1, 2


@numba.njit(cache=True, nogil=True)
def _below(i: int, removed: np.ndarray, rw: np.ndarray, m: int) -> float:  # pragma: no cover - numba
    """Ŵ_i: the removed weight at positions ≤ i, summed in position order."""
    s = 0.0
    for r in range(m):
        if removed[r] > i:
            break
        s += rw[r]
    return s


@numba.njit(cache=True, nogil=True)
def _bounds(
    i: int, cdf: np.ndarray, rel: float, ab: float, removed: np.ndarray, rw: np.ndarray, m: int
) -> tuple[float, float]:  # pragma: no cover - numba
    """(lower, upper) bounds of the exact remaining cumulative weight at position i (i = −1: 0)."""
    if i < 0:
        return 0.0, 0.0
    s = cdf[i]
    w = _below(i, removed, rw, m)
    err = 2.0 * rel * (s + w) + 3.0 * ab
    return s - w - err, s - w + err


@numba.njit(cache=True, nogil=True)
def _remove(pos: int, w: np.ndarray, removed: np.ndarray, rw: np.ndarray, m: int) -> int:  # pragma: no cover - numba
    """Insert position ``pos`` into the sorted removals; the new count."""
    r = m
    while r > 0 and removed[r - 1] > pos:
        removed[r], rw[r] = removed[r - 1], rw[r - 1]
        r -= 1
    removed[r], rw[r] = pos, w[pos]
    return m + 1


@numba.njit(cache=True, nogil=True)
def _step(
    word: np.uint64, cdf: np.ndarray, rel: float, ab: float, removed: np.ndarray, rw: np.ndarray, m: int
) -> int:  # pragma: no cover - numba
    """The position decided by U's 64-bit prefix ``word`` on the float bounds, or −1."""
    last: int = cdf.shape[0] - 1
    m_lo, m_hi = _bounds(last, cdf, rel, ab, removed, rw, m)
    mass = cdf[last] - _below(last, removed, rw, m)
    b = float(word)  # within 1 ulp of the word: widened by 4u below
    t = (b + 0.5) * 2.0**-64 * mass
    a = min(int(np.searchsorted(cdf, t, side="right")), last)
    # the first position whose remaining cumulative weight exceeds t: a guess the bounds check;
    # each pass moves a past one more removal, so m + 1 passes suffice
    for _ in range(m + 1):
        nxt = min(int(np.searchsorted(cdf, t + _below(a, removed, rw, m), side="right")), last)
        if nxt == a:
            break
        a = nxt
    for r in range(m):
        if removed[r] == a:
            return -1
    lo_t = b * 2.0**-64 * m_lo * (1.0 - 4 * _U)
    hi_t = (b + 1.0) * 2.0**-64 * m_hi * (1.0 + 4 * _U)
    if lo_t >= _bounds(a - 1, cdf, rel, ab, removed, rw, m)[1] and hi_t < _bounds(a, cdf, rel, ab, removed, rw, m)[0]:
        return a
    return -1


@numba.njit(cache=True, nogil=True)
def _steps(  # pragma: no cover - numba
    j: int,
    words: np.ndarray,
    cdf: np.ndarray,
    w: np.ndarray,
    rel: float,
    ab: float,
    total: float,
    out: np.ndarray,
    removed: np.ndarray,
    rw: np.ndarray,
    m: int,
) -> tuple[int, int, int]:
    """Steps j, j + 1, … on the float path: (the next step, its status, the removal count). Status
    _SLOW: step j needs the decimal path; _REBUILD_NOW: the mass left is small, recompute the
    weights before step j; _DONE: all k steps drawn. ``out`` holds positions."""
    k = words.shape[0]
    while j < k:
        a = _step(words[j], cdf, rel, ab, removed, rw, m)
        if a < 0:
            return j, _SLOW, m
        out[j] = a
        j += 1
        if j == k:
            break
        m = _remove(a, w, removed, rw, m)
        if _bounds(cdf.shape[0] - 1, cdf, rel, ab, removed, rw, m)[0] < _REBUILD * total:
            return j, _REBUILD_NOW, m
    return j, _DONE, m


class _Weights:
    """The float cumulative weights of the items ``alive`` at the last rebuild, and the removals
    since (positions in ``alive``, sorted, with their float weights)."""

    def __init__(self, q: np.ndarray, alive: npt.NDArray[np.intp], scale: float, k: int) -> None:
        sub = q[alive]
        x = (sub - sub.max()) * scale
        self.alive = alive
        self.w = np.exp(x)
        self.cdf = np.cumsum(self.w)
        self.total = float(self.cdf[-1])
        self.rel, self.ab = _em_error(x)
        self.removed = np.empty(k, np.int64)
        self.rw = np.empty(k)
        self.m = 0

    def left(self) -> npt.NDArray[np.intp]:
        """The positions not removed, in order."""
        keep = np.ones(self.alive.shape[0], dtype=bool)
        keep[self.removed[: self.m]] = False
        return np.flatnonzero(keep)


def em_exact_peel(
    q: np.ndarray, d: np.ndarray, epsilon: float, k: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """k draws without replacement, each P(a) ∝ exp(ε′ (q_a − q*) / (2Δmax)) over the items left,
    ε′ = :func:`step_epsilon` (ε, k) and Δmax the whole set's, sampled exactly: gumbel's ordered
    top k (module docstring)."""
    eps = step_epsilon(epsilon, k)
    if k == 1:
        return em_exact_sample(q, d, eps, rng, 1).astype(np.int64)
    dmax = np.array([float(d.max())])
    scale = eps / (2.0 * dmax[0])
    weights = _Weights(q, np.arange(q.shape[0], dtype=np.intp), scale, k)
    words = uniform_words(rng, k)  # one 64-bit prefix of U per step
    pos = np.empty(k, dtype=np.int64)  # positions in weights.alive at the time of each step
    out = np.empty(k, dtype=np.int64)
    j = 0
    while j < k:
        w = weights
        nxt, status, w.m = _steps(j, words, w.cdf, w.w, w.rel, w.ab, w.total, pos, w.removed, w.rw, w.m)
        out[j:nxt] = w.alive[pos[j:nxt]]
        j = nxt
        if status == _SLOW:  # the decimal comparison over the items left, in the same order
            left = w.left()
            a = int(left[_em_slow(q[w.alive[left]], dmax, eps, int(words[j]), rng)])
            out[j] = w.alive[a]
            j += 1
            if j < k:
                w.m = _remove(a, w.w, w.removed, w.rw, w.m)
                status = (
                    _REBUILD_NOW
                    if _bounds(w.cdf.shape[0] - 1, w.cdf, w.rel, w.ab, w.removed, w.rw, w.m)[0] < _REBUILD * w.total
                    else _SLOW
                )
        if status == _REBUILD_NOW and j < k:
            weights = _Weights(q, w.alive[w.left()], scale, k)
    return out
