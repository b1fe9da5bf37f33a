"""Combined GEM's sampler (paper §VII): one user's draws, and a batch of users' (``select_batch``).

Each trial reports b = [spearman(q, Δ) ≥ 0] by binary randomised response, an exact Bernoulli
on a lazily drawn uniform (:func:`recsvc.mechanisms.exact_sampling.exact_bernoulli`), then runs
mgem (reported 1) or gem (reported 0) at ε_g as an exact exponential race on the real q'
(:class:`recsvc.mechanisms.gem.GemUtilities`, :func:`recsvc.mechanisms.exact_race.exponential_rows`).

Words, in order: the ``size`` bits' uniforms (and the words a straddling one refines with), then
one 53-bit cell per candidate for each trial, the trials reporting 1 first, then those reporting
0, then the words of the rare undecided races. Every trial's bit and cells are i.i.d. uniforms,
so the law is the mixture :func:`recsvc.mechanisms.gem.combined_gem_log_probabilities` states.

The batch runs this row by row on each user's own stream, so row b is the same function of
``stream(b)`` as :func:`combined_gem_sample` (a chunk of users gives the rows of one big call);
what it shares across rows is only what does not depend on the scores: the split, the bit's
thresholds, and the sort of Δ when the users share it (the Spearman ranks' half).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_race import EXPONENTIAL, _argmax_row, _ratio_leaders
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.mechanisms.gem import GemUtilities, checked_t, correlation_split, hull, report_correlation_bit, tangents
from recsvc.mechanisms.params import ParamValues
from recsvc.stats import argsort_fast


def _row(
    q: np.ndarray,
    d: np.ndarray,
    d_order: np.ndarray | None,
    epsilon: float,
    p: ParamValues,
    rng: np.random.Generator,
    size: int,
) -> npt.NDArray[np.int64]:
    _, eps_g = correlation_split(p).stage_epsilons(epsilon)
    t = checked_t(q, d, eps_g, p["beta"])  # both branches' input check, before the bit is drawn
    ones = report_correlation_bit(q, d, epsilon, p, rng, size, d_order) == 1
    out = np.zeros(size, dtype=np.int64)
    n = q.shape[0]
    if n == 1:
        return out  # one candidate: the race draws nothing
    n1 = int(np.count_nonzero(ones))
    x = rng.random((size, n))  # the 1-reports' cells first, then the 0-reports'
    qc, dc = np.ascontiguousarray(q), np.ascontiguousarray(d)
    top = _races(qc, dc, t, eps_g, x, n1)
    for r in np.flatnonzero(top < 0).tolist():  # undecided by the float bounds: exact_race decides
        top[r] = _argmax_row(GemUtilities(q, d, eps_g, -t if r < n1 else t), EXPONENTIAL, None, x[r], rng)
    out[ones] = top[:n1]
    out[~ones] = top[n1:]
    return out


@numba.njit(cache=True, nogil=True)
def _races(
    q: np.ndarray, d: np.ndarray, t: float, eps_g: float, x: np.ndarray, n1: int
) -> np.ndarray:  # pragma: no cover - numba
    """The exponential race on each row of cells x: rows below n1 run mgem (−t), the rest gem
    (t); a row's leader, or −1 where the float bounds do not decide it. The bounds are
    :class:`~recsvc.mechanisms.gem.GemUtilities`' (``value``, ``err``) and
    :func:`recsvc.mechanisms.exact_race.exponential_rows`' (ρ, the leader's product against the
    runner-up's), the same float operations in one compiled pass; numba's exp is libm's (< 1 ulp,
    inside the 4 ulps ρ allows). A change to either bound must be made here too: calling them per
    branch instead cost 1.3 × the float sampler at n = 500, against 1.0 × for this pass."""
    rows = x.shape[0]
    out = np.empty(rows, np.int64)
    half = eps_g * 0.5
    q_over = np.abs(q).max() / d.min()
    for branch in range(2):
        lo, hi = (0, n1) if branch == 0 else (n1, rows)
        if lo == hi:
            continue
        tt = -t if branch == 0 else t
        s = q - tt * d
        hx, hy, edge = hull(s, d)
        value = tangents(hx, hy, edge, d, s) * (eps_g * 0.5 * (1.0 - 6.0 * _U))
        err = 4.1 * _U * (q_over + abs(tt)) * half * (1.0 + 4.0 * _U) + 2.0**-1060
        g = np.exp(-value)
        rho = 8.01 * _U + 40.1 * _U * min(-value.min(), 746.0) + 2.0 * err
        top, x_top, second = _ratio_leaders(g, x[lo:hi])
        for r in range(hi - lo):
            lead = (x_top[r] + 2.0**-53) * g[top[r]] * ((1.0 + rho) * (1.0 + 4.0 * _U))
            ok = lead < second[r] * (1.0 - rho - 4.0 * _U) and lead < 1e290
            out[lo + r] = top[r] if ok and not math.isnan(lead) else -1
    return out


def _order(d: np.ndarray) -> np.ndarray | None:
    return argsort_fast(d) if d.shape[0] >= 2 else None


def combined_gem_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.int64]:
    """Combined GEM: privately report b = [spearman(q, Δ) ≥ 0] by binary randomised response
    with ε_c = cε, then run mgem (bit 1) or gem (bit 0) with ε_g, both exactly.

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a: RR is ε_c-DP for any bit, the selection is
    ε_g-DP, and basic (adaptive) composition gives ε_c + ε_g ≤ ε on the reals (the split rounds
    ε_g down: :meth:`recsvc.mechanisms.privacy.Split.stage_epsilons`). Each trial reports its own bit.
    """
    return _row(q, d, _order(d), epsilon, p, rng, size)


def combined_gem_batch(
    q: np.ndarray,
    d: np.ndarray,
    epsilon: float,
    p: ParamValues,
    stream: Callable[[int], np.random.Generator],
    trials: int,
) -> npt.NDArray[np.int64]:
    """``trials`` draws for each row of q (B, n) with Δ (B, n): row b is
    :func:`combined_gem_sample` on ``stream(b)``. Δ's sort is reused while the rows' Δ agree."""
    out = np.empty((q.shape[0], trials), dtype=np.int64)
    shared = d.shape[0] > 0 and d.strides[0] == 0  # one Δ broadcast to every row
    d_order = _order(d[0]) if shared else None
    for b in range(q.shape[0]):
        order = d_order if shared else _order(d[b])
        out[b] = _row(q[b], d[b], order, epsilon, p, stream(b), trials)
    return out
