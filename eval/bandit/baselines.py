"""The non-private baselines: UCB (Appendix H) in several readings of its formula, and Gaussian
Thompson sampling. Each plays a reward table (``environment.reward_table``) and returns the
arm chosen at every step (index 0 unused; steps 1 and 2 pull arms 0 and 1).

Appendix H's UCB: q̂_{a,t} = (1/N_t(a)) Σ_{t' ≤ t} r_{t'} I(a_{t'} = a) + α √(ln T / N_t(a)), α = √2.
§IX reports that this UCB "keeps picking action 1 for all time steps … even once it is the
sub-optimal action". The readings below are the plausible ways to read (or mis-implement) the
formula; ``report.md`` shows which of them, if any, never switch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np

DISCOUNT = 0.995  # discounted reading: memory ≈ 1/(1 − γ) = 200 steps, the quantiles' window


def _play(rewards: np.ndarray, index: Callable[[int], int], update: Callable[[int, float], None]) -> np.ndarray:
    """Runs an index policy: ``index(t)`` picks the arm at step t ≥ 3."""
    horizon = rewards.shape[0] - 1
    arms = np.zeros(horizon + 1, dtype=np.int8)
    for t in range(1, horizon + 1):
        a = t - 1 if t <= 2 else index(t)
        arms[t] = a
        update(a, float(rewards[t, a]))
    return arms


def ucb(rewards: np.ndarray, alpha: float = math.sqrt(2.0), reading: str = "stated", window: int = 200) -> np.ndarray:
    """UCB in one of :data:`READINGS` (ties go to arm 0; they have probability 0 with real rewards)."""
    if reading not in READINGS:
        raise ValueError(f"unknown UCB reading {reading!r}; expected one of {', '.join(READINGS)}")
    s = [0.0, 0.0]  # reward sums (discounted in the discounted reading)
    n = [0.0, 0.0]  # pull counts (discounted likewise)
    recent: list[deque[float]] = [deque(maxlen=window), deque(maxlen=window)]
    horizon = rewards.shape[0] - 1
    log_big_t = math.log(horizon)

    def update(a: int, r: float) -> None:
        if reading == "discounted":
            for arm in (0, 1):
                s[arm] *= DISCOUNT
                n[arm] *= DISCOUNT
        s[a] += r
        n[a] += 1.0
        recent[a].append(r)

    def score(a: int, t: int) -> float:
        if reading == "ln_t":  # the textbook UCB1 bonus: ln of the current step, not of the horizon
            return s[a] / n[a] + alpha * math.sqrt(math.log(t) / n[a])
        if reading == "sums":  # the sum of rewards, not divided by N_t(a)
            return s[a] + alpha * math.sqrt(log_big_t / n[a])
        if reading == "greedy":  # α = 0, or equivalently a bonus with N_t (all pulls) shared by both arms
            return s[a] / n[a]
        if reading == "windowed":  # mean of the arm's last w rewards
            m = len(recent[a])
            return sum(recent[a]) / m + alpha * math.sqrt(log_big_t / m)
        return s[a] / n[a] + alpha * math.sqrt(log_big_t / n[a])  # stated, and discounted (s, n discounted)

    return _play(rewards, lambda t: int(score(1, t) > score(0, t)), update)


READINGS: dict[str, str] = {
    "stated": "cumulative means, bonus α√(ln T / N_t(a)) (Appendix H as written)",
    "ln_t": "cumulative means, bonus α√(ln t / N_t(a)) (textbook UCB1)",
    "windowed": "mean of the arm's last 200 rewards, bonus α√(ln T / min(N_t(a), 200))",
    "discounted": f"discounted sums and counts (γ = {DISCOUNT}), bonus α√(ln T / Ñ_t(a))",
    "sums": "reward SUMS (not divided by N_t(a)) plus α√(ln T / N_t(a))",
    "greedy": "cumulative means without a per-arm bonus (α = 0, or a bonus with N_t shared by both arms)",
}


def thompson(rewards: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Gaussian Thompson sampling (Agrawal & Goyal 2013): prior N(0, 1), unit noise variance, so
    θ_a ~ N(S_a / (N_a + 1), 1 / (N_a + 1)); pull the arm with the larger θ."""
    horizon = rewards.shape[0] - 1
    z = rng.standard_normal((horizon + 1, 2))
    s = [0.0, 0.0]
    n = [0.0, 0.0]

    def index(t: int) -> int:
        th0 = s[0] / (n[0] + 1.0) + z[t, 0] / math.sqrt(n[0] + 1.0)
        th1 = s[1] / (n[1] + 1.0) + z[t, 1] / math.sqrt(n[1] + 1.0)
        return int(th1 > th0)

    def update(a: int, r: float) -> None:
        s[a] += r
        n[a] += 1.0

    return _play(rewards, index, update)
