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
first costs O(log n + k), not O(n). Error bounds, with u = 2⁻⁵³, R the relative and A the absolute
bound of ``em``'s :func:`~recsvc.mechanisms.exact_sampling._em_error` on every float cumulative
sum (the weights' and the removed ones'):
the float difference D_i of the two sums is within 2R·(Ŝ_i + Ŵ_i) + 3A of the exact remaining
cumulative weight (the factor 2 covers the difference's own rounding and these bounds' arithmetic,
since R ≥ 40u). When the remaining mass falls below 2⁻²⁴ of the computed total, the weights are
recomputed from the items left, so the bounds stay tight relative to what is being sampled.
"""

from __future__ import annotations

import bisect
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.mechanisms.exact_sampling import _em_error, _em_slow, em_exact_sample, uniform_words

_REBUILD = 2.0**-24  # recompute the weights when the mass left is below this share of theirs


def step_epsilon(epsilon: float, k: int) -> float:
    """The largest float ε′ ≤ ε/k: k steps at ε′ consume at most ε, exactly (not up to a rounding)."""
    step = epsilon / k
    while Fraction(step) * k > Fraction(epsilon):
        step = float(np.nextafter(step, 0.0))
    return step


class _Weights:
    """The float cumulative weights of the items ``alive`` at the last rebuild, and the removals since."""

    def __init__(self, q: np.ndarray, alive: npt.NDArray[np.intp], scale: float) -> None:
        sub = q[alive]
        x = (sub - sub.max()) * scale
        self.alive = alive
        self.w = np.exp(x)
        self.cdf = np.cumsum(self.w)
        self.total = float(self.cdf[-1])
        self.rel, self.ab = _em_error(x)
        self.removed: list[int] = []  # positions in ``alive``, sorted
        self.removed_w: list[float] = []
        self.removed_cum = [0.0]  # removed_cum[j]: the sum of the first j removed weights

    def left(self) -> npt.NDArray[np.intp]:
        """The positions not removed, in order."""
        keep = np.ones(self.alive.shape[0], dtype=bool)
        keep[self.removed] = False
        return np.flatnonzero(keep)

    def below(self, i: int) -> float:
        """Ŵ_i: the removed weight at positions ≤ i."""
        return self.removed_cum[bisect.bisect_right(self.removed, i)]

    def remove(self, i: int) -> None:
        j = bisect.bisect_left(self.removed, i)
        self.removed.insert(j, i)
        self.removed_w.insert(j, float(self.w[i]))
        cum = [0.0]
        for v in self.removed_w:  # the same order of additions as a cumulative sum: within R
            cum.append(cum[-1] + v)
        self.removed_cum = cum

    def bounds(self, i: int) -> tuple[float, float]:
        """(lower, upper) bounds of the exact remaining cumulative weight at position i (i = −1: 0)."""
        if i < 0:
            return 0.0, 0.0
        s, w = float(self.cdf[i]), self.below(i)
        err = 2.0 * self.rel * (s + w) + 3.0 * self.ab
        return s - w - err, s - w + err

    def step(self, word: int) -> int | None:
        """The position decided by U's 64-bit prefix ``word`` on the float bounds, or None."""
        last = int(self.cdf.shape[0]) - 1
        m_lo, m_hi = self.bounds(last)
        mass = float(self.cdf[last]) - self.below(last)
        t = (word + 0.5) * 2.0**-64 * mass
        a = min(int(self.cdf.searchsorted(t, side="right")), last)
        # The first position whose remaining cumulative weight exceeds t: a guess, which the
        # bounds below check. Each pass moves a past one more removal, so len + 1 passes suffice.
        for _ in range(len(self.removed) + 1):
            nxt = min(int(self.cdf.searchsorted(t + self.below(a), side="right")), last)
            if nxt == a:
                break
            a = nxt
        b = float(word)
        lo_t = b * 2.0**-64 * m_lo * (1.0 - 4 * _U)
        hi_t = (b + 1.0) * 2.0**-64 * m_hi * (1.0 + 4 * _U)
        if a in self.removed:
            return None
        if lo_t >= self.bounds(a - 1)[1] and hi_t < self.bounds(a)[0]:
            return a
        return None


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
    weights = _Weights(q, np.arange(q.shape[0], dtype=np.intp), scale)
    out = np.empty(k, dtype=np.int64)
    words = uniform_words(rng, k)  # one 64-bit prefix of U per step
    for j in range(k):
        word = int(words[j])
        pos = weights.step(word)
        if pos is None:  # the decimal comparison over the items left, in the same order
            left = weights.left()
            pos = int(left[_em_slow(q[weights.alive[left]], dmax, eps, word, rng)])
        out[j] = weights.alive[pos]
        if j + 1 == k:
            break
        weights.remove(pos)
        if weights.bounds(weights.cdf.shape[0] - 1)[0] < _REBUILD * weights.total:
            weights = _Weights(q, weights.alive[weights.left()], scale)
    return out
