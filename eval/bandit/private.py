"""A private bandit policy (Appendix H): private means, private sensitivities, private selection.

* Means: each arm's reward sum is released by the hybrid continual counter (``counter.py``,
  ε_M, per-item range R = 1) indexed by that arm's pull count N_t(a), which the private
  selections make public; score q_a = clip(Ŝ_a(N_t(a)) / N_t(a), 0, 1), the clip to the public
  reward range being post-processing (docs/reference/specification.md §1: scores are clipped to their
  range before selecting).
* Sensitivities: Δ_a = max(|p90 − p10|, 1e-6) from an ε_p-DP exponential-mechanism quantile pair
  (``quantiles.py``) over each disjoint window of w observations of arm a, so every reward is
  used once; until arm a's first window is full, Δ_a = 1, the width of the reward range.
* Selection: ``recsvc.mechanisms.select`` on (q, Δ) with ε_S; kRR ignores Δ, RNM uses max Δ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eval.bandit.config import BanditConfig
from eval.bandit.counter import draw_noise, noise_sequence
from eval.bandit.environment import REWARD_HI, REWARD_LO
from eval.bandit.quantiles import quantile_pair
from recsvc.mechanisms import select

MIN_SENSITIVITY = 1e-6  # docs/reference/specification.md §1: Δ = max(hi − lo, 1e-6)


@dataclass
class PrivateTrace:
    arms: np.ndarray  # (T + 1,) int8, index 0 unused
    scores: np.ndarray  # (len(grid), 2): the private means the next selection sees, after step grid[i]
    quantiles: np.ndarray  # (k, 5): arm, step, pulls of that arm, p10, p90 (one row per window)


def play(
    policy: str, cfg: BanditConfig, rewards: np.ndarray, grid: np.ndarray, rng: np.random.Generator
) -> PrivateTrace:
    """One run of a private policy (it selects with the mechanism of its name) on the reward table."""
    epsilon, params, window = cfg.epsilon_of(policy), cfg.params_of(policy), cfg.window
    horizon = rewards.shape[0] - 1
    width = REWARD_HI - REWARD_LO
    noise = [noise_sequence(draw_noise(horizon, cfg.epsilon_means, rng, width)) for _ in range(2)]
    s = [0.0, 0.0]
    n = [0, 0]
    sens = [width, width]
    buf: list[list[float]] = [[], []]
    arms = np.zeros(horizon + 1, dtype=np.int8)
    scores = np.empty((grid.size, 2))
    rows: list[tuple[int, int, int, float, float]] = []
    g = 0

    def private_mean(a: int) -> float:
        return min(REWARD_HI, max(REWARD_LO, (s[a] + noise[a][n[a]]) / n[a]))

    for t in range(1, horizon + 1):
        a = (
            t - 1
            if t <= 2
            else select(
                policy, (private_mean(0), private_mean(1)), sens, epsilon, rng, allow_non_private=False, **params
            )
        )
        r = float(rewards[t, a])
        arms[t] = a
        s[a] += r
        n[a] += 1
        buf[a].append(r)
        if len(buf[a]) == window:
            lo, hi = quantile_pair(np.array(buf[a]), cfg.epsilon_pair, rng, REWARD_LO, REWARD_HI)
            sens[a] = max(abs(hi - lo), MIN_SENSITIVITY)
            rows.append((a, t, n[a], lo, hi))
            buf[a] = []
        while g < grid.size and grid[g] == t:
            scores[g] = (private_mean(0) if n[0] else np.nan, private_mean(1) if n[1] else np.nan)
            g += 1
    return PrivateTrace(arms, scores, np.array(rows, dtype=np.float64).reshape(-1, 5))
