"""One work unit of the bandit study: one policy (or UCB reading) on one seed's reward table.

Streams are reproducible and independent of which policies run or how the units are scheduled:
seed s's reward table uses SeedSequence(s, spawn_key=(0,)), policy p's randomness (counter
noise, quantiles, selections, Thompson draws) SeedSequence(s, spawn_key=(1 + index of p,)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eval.bandit import baselines, private
from eval.bandit.config import POLICIES, BanditConfig
from eval.bandit.environment import reward_table
from recsvc.rng import stream

SWITCH_WINDOW = 100  # a policy has switched at a pull of the new best arm that wins the majority of the next 100 steps
GRID_POINTS = 500  # recorded steps per run (plus 1, t_shift and T)
READING_PREFIX = "ucb:"  # units that run a UCB reading other than the stated one


def sample_steps(horizon: int, shift: int, points: int = GRID_POINTS) -> np.ndarray:
    """The recorded steps: every ⌈T/points⌉-th step, plus 1, t_shift and T."""
    stride = max(1, -(-horizon // points))
    return np.unique(np.concatenate(([1, shift, horizon], np.arange(stride, horizon + 1, stride)))).astype(np.int64)


def switch_delay(arms: np.ndarray, shift: int, new_best: int, window: int = SWITCH_WINDOW) -> int | None:
    """Steps after the shift until a pull of the new best arm that starts a run of ``window`` steps
    (fewer near the end) in which it is pulled in the majority; None if that never happens."""
    post = (arms[shift + 1 :] == new_best).astype(np.int64)
    if post.size == 0:
        return None
    c = np.concatenate(([0], np.cumsum(post)))
    d = np.arange(post.size)
    end = np.minimum(d + window, post.size)
    return _first((post == 1) & (2 * (c[end] - c[d]) > end - d))


def _first(hits: np.ndarray) -> int | None:
    where = np.flatnonzero(hits)
    return int(where[0]) if where.size else None


@dataclass
class UnitResult:
    name: str  # a policy, or READING_PREFIX + a UCB reading
    seed: int
    cumulative: np.ndarray  # (G,) cumulative reward at the recorded steps
    empirical: np.ndarray  # (G, 2) non-private mean reward of each arm so far
    scores: np.ndarray  # (G, 2) the private means the policy selects on (NaN for the baselines)
    quantiles: np.ndarray  # (k, 5) arm, step, pulls, p10, p90 (private policies)
    reward_before: float  # Σ rewards over t ≤ shift
    reward_after: float  # Σ rewards over t > shift
    best_share_before: float  # share of steps 1 … shift that pulled the better arm
    best_share_after: float
    switch_delay: int | None
    first_new_best: int | None  # steps after the shift until the new best arm's first pull


def unit_names(cfg: BanditConfig) -> list[str]:
    """The policies, then every UCB reading except the stated one (that is the ``ucb`` policy)."""
    readings = [READING_PREFIX + r for r in baselines.READINGS if r != "stated"] if "ucb" in cfg.policies else []
    return list(cfg.policies) + readings


def run_unit(unit: tuple[int, str], cfg: BanditConfig) -> UnitResult:
    """The engine's work unit: (seed, name) → its :class:`UnitResult`."""
    seed, name = unit
    rewards = reward_table(cfg.arms, cfg.horizon, cfg.shift, stream(seed, 0))
    grid = sample_steps(cfg.horizon, cfg.shift)
    arms, scores, quantiles = _play(name, seed, cfg, rewards, grid)
    steps = np.arange(1, cfg.horizon + 1)
    got = rewards[steps, arms[1:]]
    cum = np.concatenate(([0.0], np.cumsum(got)))
    pulls = np.stack([np.cumsum(arms[1:] == a) for a in (0, 1)], axis=1)  # (T, 2) pulls up to step t
    sums = np.stack([np.cumsum(np.where(arms[1:] == a, got, 0.0)) for a in (0, 1)], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        empirical = np.where(pulls[grid - 1] > 0, sums[grid - 1] / pulls[grid - 1], np.nan)
    before, after = cfg.arms.best(False), cfg.arms.best(True)
    s = cfg.shift
    return UnitResult(
        name=name,
        seed=seed,
        cumulative=cum[grid],
        empirical=empirical,
        scores=scores,
        quantiles=quantiles,
        reward_before=float(cum[s]),
        reward_after=float(cum[-1] - cum[s]),
        best_share_before=float(np.mean(arms[1 : s + 1] == before)),
        best_share_after=float(np.mean(arms[s + 1 :] == after)),
        switch_delay=switch_delay(arms, s, after),
        first_new_best=_first(arms[s + 1 :] == after),
    )


def _play(
    name: str, seed: int, cfg: BanditConfig, rewards: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arms, scores, quantiles) of one policy or UCB reading: see :class:`UnitResult`."""
    if name == "ucb" or name.startswith(READING_PREFIX):
        reading = "stated" if name == "ucb" else name[len(READING_PREFIX) :]
        arms = baselines.ucb(rewards, cfg.alpha, reading, cfg.window)
    elif name == "thompson":
        arms = baselines.thompson(rewards, stream(seed, 1 + POLICIES.index(name)))
    else:
        trace = private.play(name, cfg, rewards, grid, stream(seed, 1 + POLICIES.index(name)))
        return trace.arms, trace.scores, trace.quantiles
    return arms, np.full((grid.size, 2), np.nan), np.zeros((0, 5))  # a baseline has no private scores
