"""Private quantiles by the exponential mechanism (Smith 2011), and the paper's truncated
sensitivity Δ_a = |p90 − p10| from them (Appendix H).

For n values clipped to [lo, hi] and sorted, x_(0) = lo ≤ x_(1) ≤ … ≤ x_(n) ≤ x_(n+1) = hi, the
output is drawn from the density p(y) ∝ exp(ε u(y) / 2) on [lo, hi], with u(y) = −|i − q n| on
the interval [x_(i), x_(i+1)) (i values lie below y): interval i is chosen with probability
∝ (x_(i+1) − x_(i)) exp(−ε |i − q n| / 2), then y is uniform in it. Replacing one value moves
u(y) by at most 1 for every y, so the numerator and the normaliser each move by at most e^{ε/2}:
ε-DP. A pair (p10, p90) spends ε/2 on each quantile: ε-DP by basic composition.
"""

from __future__ import annotations

import numpy as np


def interval_log_probs(
    values: np.ndarray, q: float, epsilon: float, lo: float, hi: float
) -> tuple[np.ndarray, np.ndarray]:
    """(edges (n+2,), log P(interval i) (n+1,)): the mechanism's exact output distribution is
    uniform within interval i = [edges[i], edges[i+1]] (empty intervals have log P = −inf)."""
    x = np.sort(np.clip(np.asarray(values, dtype=np.float64), lo, hi))
    n = x.size
    if n == 0 or not 0.0 <= q <= 1.0 or not epsilon > 0 or not lo < hi:
        raise ValueError(f"need ≥ 1 value, q in [0, 1], ε > 0 and lo < hi; got n={n}, q={q}, ε={epsilon}, [{lo}, {hi}]")
    edges = np.concatenate(([lo], x, [hi]))
    width = np.diff(edges)
    with np.errstate(divide="ignore"):
        logw = np.log(width) - 0.5 * epsilon * np.abs(np.arange(n + 1) - q * n)
    top = logw.max()
    return edges, logw - (top + np.log(np.exp(logw - top).sum()))


def density(values: np.ndarray, q: float, epsilon: float, lo: float, hi: float, at: np.ndarray) -> np.ndarray:
    """The output density at the points ``at`` (inside [lo, hi], off the edges): for audits."""
    edges, logp = interval_log_probs(values, q, epsilon, lo, hi)
    idx = np.clip(np.searchsorted(edges, at, side="right") - 1, 0, logp.size - 1)
    width = np.diff(edges)[idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(width > 0, np.exp(logp[idx]) / np.where(width > 0, width, 1.0), 0.0)


def em_quantile(
    values: np.ndarray, q: float, epsilon: float, rng: np.random.Generator, lo: float = 0.0, hi: float = 1.0
) -> float:
    """One ε-DP estimate of the q-quantile of ``values`` (clipped to [lo, hi])."""
    edges, logp = interval_log_probs(values, q, epsilon, lo, hi)
    i = int(np.argmax(logp + rng.gumbel(size=logp.size)))  # Gumbel-max: P(i) = exp(logp[i])
    return float(edges[i] + rng.random() * (edges[i + 1] - edges[i]))


def quantile_pair(
    values: np.ndarray,
    epsilon_pair: float,
    rng: np.random.Generator,
    lo: float = 0.0,
    hi: float = 1.0,
    quantiles: tuple[float, float] = (0.1, 0.9),
) -> tuple[float, float]:
    """(p_low, p_high), ε_pair-DP together (ε_pair/2 each); Δ = |p_high − p_low| (App. H)."""
    return (
        em_quantile(values, quantiles[0], epsilon_pair / 2.0, rng, lo, hi),
        em_quantile(values, quantiles[1], epsilon_pair / 2.0, rng, lo, hi),
    )
