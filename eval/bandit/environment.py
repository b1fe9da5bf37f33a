"""The two-armed bandit of Appendix H: rewards N(m_a, σ_a²) clipped to [0, 1], swapped at t_shift.

Rewards are clipped to [0, 1] (the paper says "clipped" without a range; means 0.2/0.8 and
σ ≤ 0.3 put almost all mass inside it). [0, 1] is the public range of one reward: it bounds the
counter's per-item change (R = 1) and the quantiles' domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

REWARD_LO = 0.0
REWARD_HI = 1.0


@dataclass(frozen=True)
class Arms:
    """Means and standard deviations before the shift; after it both are swapped between arms."""

    means: tuple[float, float] = (0.2, 0.8)
    sigmas: tuple[float, float] = (0.1, 0.3)

    def params(self, shifted: bool) -> tuple[np.ndarray, np.ndarray]:
        m, s = np.array(self.means), np.array(self.sigmas)
        return (m[::-1], s[::-1]) if shifted else (m, s)

    def expected(self, shifted: bool) -> np.ndarray:
        """E[clipped reward] per arm."""
        norm = _norm()
        m, s = self.params(shifted)
        a, b = (REWARD_LO - m) / s, (REWARD_HI - m) / s
        # E[clip(X, lo, hi)] for X ~ N(m, s²)
        inside = m * (norm.cdf(b) - norm.cdf(a)) + s * (norm.pdf(a) - norm.pdf(b))
        return inside + REWARD_LO * norm.cdf(a) + REWARD_HI * norm.sf(b)

    def quantile(self, p: float, shifted: bool) -> np.ndarray:
        """The p-quantile of each arm's clipped reward (the dashed lines of Fig. 14(c)/(d))."""
        m, s = self.params(shifted)
        return np.clip(m + s * _norm().ppf(p), REWARD_LO, REWARD_HI)

    def best(self, shifted: bool) -> int:
        return int(np.argmax(self.expected(shifted)))


def _norm() -> Any:
    # imported when used: the study's config holds Arms, and `recsvc --help` loads the config
    from scipy.stats import norm

    return norm


def reward_table(arms: Arms, horizon: int, shift: int, rng: np.random.Generator) -> np.ndarray:
    """(horizon + 1, 2): row t holds both arms' clipped rewards at step t (row 0 unused); steps
    t ≤ shift use the first parameters, t > shift the swapped ones. Every policy of a seed plays
    against the same table (common random numbers: paired comparisons between policies)."""
    z = rng.standard_normal((horizon + 1, 2))
    t = np.arange(horizon + 1)[:, None]
    m0, s0 = arms.params(False)
    m1, s1 = arms.params(True)
    r = np.where(t <= shift, m0 + s0 * z, m1 + s1 * z)
    r[0] = np.nan
    return np.clip(r, REWARD_LO, REWARD_HI)
