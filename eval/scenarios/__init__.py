"""The paper's synthetic selection problems, by name (main paper §VI, §VII and Appendix F).

A scenario is a population of ``repeats`` score vectors over ``n`` candidates (one row per
trial / synthetic user) plus per-candidate public sensitivities. Exactly as the paper
describes (§VI "To define Δ_a …"): draw the rows, take each candidate's lower/upper
percentile over the rows as its clip range [lo, hi], set Δ_a = hi − lo (floored at 1e-6 like
the real pipeline) and clip every score to its range. The bimodal scenarios 1–3 have one fixed
score vector and the sweep one fixed instance per row, so their Δ are given directly and each
range is centred on its score.

- ``"1"``/``"2"``/``"3"``  bimodal (Figure 2): half the candidates score 1, half −1; Δ ∈ {1, 1.8}
  (``proportion``: another share of high scores, Figure 18 / :mod:`eval.scenarios.proportion`).
  1: high score ↔ Δ 1.8 (positive correlation); 2: high score ↔ Δ 1 (negative);
  3: each group split equally between Δ 1 and 1.8 (no correlation).
- ``"4"``  σ_1 ≤ … ≤ σ_n sorted draws of N_[0.01,0.7](0.5, 1); P_a = N(log a, σ_a²) (positive).
- ``"5"``  P_a = N(0.1a, 2.3 − 0.02a) (variance; negative correlation).
- ``"6"``  μ_a ~ U[0,1], σ_a ~ N_[0.01,0.7](0.5, 1); P_a = N(μ_a, σ_a²) (no correlation: of 64
  independent draws of (μ, σ) the least rank-correlated one is kept, so that the users' ρ(q, Δ)
  is centred on 0 and not on one draw's chance correlation of about ±0.1).
- ``"7"``/``"8"``  Appendix F, combined GEM's polarised users: group 0 has base scores
  −8 + 8a/100 (negative correlation), group 1 has 8 − 8a/100 (positive), plus N(0, σ²) noise
  per user and candidate with σ = 0.5 (7, strong) or 3 (8, weak). Clip range: the 5th–95th
  percentiles (the red lines of Figures 19–20).
- ``"sweep"``  Figure 10 ("a linear relationship between scores and sensitivities"): x_a,
  z_a ~ N(0,1), the score q_a = x_a and Δ_a = P_a = (t x_a + z_a)/5 − min_a (t x + z)/5 (floored
  at 1e-6): the paper defines P_a as a number here, not as a distribution as in 4–6, so an
  instance has no per-trial noise. The paper draws ONE instance per level; one instance's
  outcome depends a lot on its draw (e.g. on which candidate gets the smallest Δ), so every row
  (synthetic user) here is its own independent instance and results average over them.
  corr(q, Δ) = t/√(t² + 1) in expectation (Spearman ≈ the same), so it grows with t over the
  paper's levels (:data:`SWEEP_LEVELS`) from ≈ −0.98 to ≈ +0.98, as Figure 10's text says.
  (§VI's general recipe resamples scores per trial; a variant with q_a ~ N(x_a, (P_a/2.56)²), so
  that the 10–90 range is ≈ P_a, gives per-user ρ from ≈ −0.70 to ≈ +0.74 and the same winners,
  with a flatter gain for t > 0. The paper gives no distribution here, so we ship the instances.)

Where a formula is written for 100 candidates (5, 7, 8) the index a is rescaled to a·100/n so
that other ``n`` keep the paper's shape; n = 100 is exactly the paper.

Their studies beside them: :mod:`.sweep` (every sweep level in one run, Figure 10) and
:mod:`.proportion` (the share of high scores, Figure 18).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import truncnorm

from recsvc.artifact import MIN_SENSITIVITY
from recsvc.stats import spearman

SWEEP_LEVELS: tuple[float, ...] = (-5.0, -0.8, -0.3, 0.0, 0.3, 0.8, 5.0)


@dataclass(frozen=True)
class Scenario:
    """One synthetic selection problem.

    ``draws`` holds every row (repeats × n), clipped: the evaluation treats each row as one
    synthetic user. Δ is shared by all rows, ``(n,)``, except in the sweep, where every row is
    its own instance with its own Δ, ``(repeats, n)``. :meth:`row` gives row b's ``(q, Δ)``, on
    which a mechanism can be run directly; ``scores`` is row 0's q.
    """

    name: str
    description: str
    scores: np.ndarray  # (n,) clipped, = draws[0]
    sensitivities: np.ndarray  # (n,) or (repeats, n): public Δ = max(hi − lo, 1e-6)
    lo: np.ndarray  # same shape as sensitivities
    hi: np.ndarray
    draws: np.ndarray  # (repeats, n) clipped
    groups: np.ndarray | None = None  # (repeats,) group label for scenarios 7/8
    level: float | None = None  # sweep level t
    seed: int = 0

    @property
    def n(self) -> int:
        return int(self.scores.shape[0])

    @property
    def repeats(self) -> int:
        return int(self.draws.shape[0])

    def row(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Row b's clipped scores and sensitivities."""
        d = self.sensitivities if self.sensitivities.ndim == 1 else self.sensitivities[b]
        return self.draws[b], d

    def rows_sensitivities(self, start: int, stop: int) -> np.ndarray:
        """Δ of rows start..stop−1, (stop − start, n) (a read-only view when Δ is shared)."""
        if self.sensitivities.ndim == 2:
            return self.sensitivities[start:stop]
        return np.broadcast_to(self.sensitivities, (stop - start, self.n))

    def correlation(self) -> np.ndarray:
        """Spearman(q, Δ) of every row."""
        return np.asarray(spearman(self.draws, self.rows_sensitivities(0, self.repeats)))


# Generators: raw draws (R, n) for 4–8 (7/8 also each row's group); the bimodal and sweep ones give Δ too.


def _truncnorm_sd(rng: np.random.Generator, size: int) -> np.ndarray:
    """N_[0.01, 0.7](0.5; 1): normal with mean 0.5, variance 1, truncated to [0.01, 0.7]."""
    lo, hi, mu, sd = 0.01, 0.7, 0.5, 1.0
    return truncnorm.rvs((lo - mu) / sd, (hi - mu) / sd, loc=mu, scale=sd, size=size, random_state=rng)


def _bimodal(kind: str, n: int, proportion: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """The first round(proportion·n) candidates score 1, the rest −1 (Figure 2: half; Figure 18
    varies the proportion)."""
    high = int(np.floor(proportion * n + 0.5))
    if not (isinstance(proportion, (int, float)) and 0 < proportion < 1) or not 1 <= high <= n - 1:
        raise ValueError(
            f"proportion of high scores must leave at least one high and one low candidate "
            f"among n = {n}, got {proportion!r}"
        )
    idx = np.arange(n)
    q = np.where(idx < high, 1.0, -1.0)  # first ones high, as in Figure 2
    if kind == "1":
        sens = np.where(q > 0, 1.8, 1.0)
    elif kind == "2":
        sens = np.where(q > 0, 1.0, 1.8)
    else:  # "3": alternate inside each group → equal share of large and small Δ per group
        sens = np.where(np.where(q > 0, idx, idx - high) % 2 == 0, 1.8, 1.0)
    return q, sens


def _scenario_4(rng: np.random.Generator, n: int, repeats: int) -> np.ndarray:
    sigma = np.sort(_truncnorm_sd(rng, n))
    mean = np.log(np.arange(1, n + 1))
    return mean + sigma * rng.standard_normal((repeats, n))


def _scenario_5(rng: np.random.Generator, n: int, repeats: int) -> np.ndarray:
    a = np.arange(1, n + 1) * (100.0 / n)
    var = 2.3 - 0.02 * a
    return 0.1 * a + np.sqrt(var) * rng.standard_normal((repeats, n))


S6_DRAWS = 64  # independent (μ, σ) draws; scenario 6 keeps the least rank-correlated one


def _scenario_6(rng: np.random.Generator, n: int, repeats: int) -> np.ndarray:
    """μ and σ independent, as in the paper, and the drawn sample itself uncorrelated: every
    user's ρ(q, Δ) is centred on the sample correlation of μ and σ (Δ ∝ σ, q ≈ μ), and one draw
    of 100 pairs has a rank correlation of about ±0.1 (a single seed-0 draw has +0.27, which would give
    96% of the users ρ > 0). The paper calls scenario 6 the uncorrelated case, so of ``S6_DRAWS``
    independent draws the one with the smallest |Spearman(μ, σ)| is kept (≤ 0.01 at n = 100)."""
    best: tuple[np.ndarray, np.ndarray] | None = None
    best_rho = np.inf
    for _ in range(S6_DRAWS):
        mu = rng.uniform(0.0, 1.0, n)
        sigma = _truncnorm_sd(rng, n)
        rho = abs(float(spearman(mu, sigma)))
        if rho < best_rho:
            best, best_rho = (mu, sigma), rho
    if best is None:  # only if every draw had a constant μ or σ, which continuous draws do not
        raise ValueError(f"scenario 6: no (μ, σ) draw of n={n} has a defined rank correlation")
    mu, sigma = best
    return mu + sigma * rng.standard_normal((repeats, n))


def _polarised(rng: np.random.Generator, n: int, repeats: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(n) * (100.0 / n)
    base = np.stack([-8.0 + 8.0 * a / 100.0, 8.0 - 8.0 * a / 100.0])  # group 0, group 1
    groups = np.arange(repeats) % 2  # equal split, interleaved so any prefix is balanced
    return base[groups] + sigma * rng.standard_normal((repeats, n)), groups


def _sweep(rng: np.random.Generator, n: int, repeats: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(scores, Δ), both (repeats, n): one independent instance per row."""
    x = rng.standard_normal((repeats, n))
    z = rng.standard_normal((repeats, n))
    p = (level * x + z) / 5.0
    return x, np.maximum(p - p.min(axis=1, keepdims=True), MIN_SENSITIVITY)


_DESCRIPTIONS: dict[str, str] = {
    "1": "bimodal, positive correlation: score 1 with Δ 1.8, score −1 with Δ 1",
    "2": "bimodal, negative correlation: score 1 with Δ 1, score −1 with Δ 1.8",
    "3": "bimodal, no correlation: each score group split equally between Δ 1 and Δ 1.8",
    "4": "realistic, positive correlation: P_a = N(log a, σ_a²), σ sorted ascending",
    "5": "realistic, negative correlation: P_a = N(0.1a, 2.3 − 0.02a)",
    "6": "realistic, no correlation: P_a = N(μ_a, σ_a²), μ ~ U[0,1]",
    "7": "combined-GEM polarised users (σ = 0.5): half positive, half negative correlation",
    "8": "combined-GEM weakly polarised users (σ = 3): noisier, less polarised",
    "sweep": "Figure 10 correlation sweep: score x_a, Δ_a = (t x_a + z_a)/5 − min, one instance per user; ρ from −0.98 (t = −5) to +0.98 (t = 5)",
}

SCENARIOS: tuple[str, ...] = tuple(_DESCRIPTIONS)

_DEFAULT_REPEATS = {"1": 1, "2": 1, "3": 1, "4": 1000, "5": 1000, "6": 1000, "7": 5000, "8": 5000, "sweep": 100}
_PERCENTILES = {"4": (10.0, 90.0), "5": (10.0, 90.0), "6": (10.0, 90.0), "7": (5.0, 95.0), "8": (5.0, 95.0)}


def scenario(
    name: str,
    n: int = 100,
    seed: int = 0,
    *,
    repeats: int | None = None,
    level: float = 0.8,
    proportion: float = 0.5,
) -> Scenario:
    """Builds scenario ``name`` with ``n`` candidates; ``repeats`` rows (default per scenario:
    1 for the fixed bimodal ones (1–3), 100 instances for the sweep, 1000 for 4–6, 5000 for 7–8
    as in Appendix F).
    ``level`` is the sweep's t and ``proportion`` the share of high scores in the bimodal
    scenarios 1–3 (Figure 18; default ½ as in Figure 2); each is ignored elsewhere."""
    name = str(name)
    if name not in _DESCRIPTIONS:
        raise ValueError(f"unknown scenario {name!r}; expected one of {', '.join(SCENARIOS)}")
    if isinstance(n, bool) or int(n) != n or n < 2:
        raise ValueError(f"scenario needs an integer n ≥ 2 candidates, got {n!r}")
    n = int(n)
    repeats = _DEFAULT_REPEATS[name] if repeats is None else repeats
    if isinstance(repeats, bool) or int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {repeats!r}")
    repeats = int(repeats)
    if not np.isfinite(level):
        raise ValueError(f"sweep level must be finite, got {level!r}")
    description = _DESCRIPTIONS[name]

    rng = np.random.default_rng(np.random.SeedSequence(seed))
    if name == "sweep":
        draws, sens = _sweep(rng, n, repeats, float(level))
        return Scenario(
            name,
            f"{description} (t = {level:g})",
            draws[0].copy(),
            sens,
            draws - sens / 2.0,
            draws + sens / 2.0,
            draws,
            level=float(level),
            seed=seed,
        )
    if name in ("1", "2", "3"):
        q, sens = _bimodal(name, n, proportion)
        draws = np.broadcast_to(q, (repeats, n)).copy()
        if proportion != 0.5:
            description += f" ({int((q > 0).sum())} of {n} high)"
        return Scenario(name, description, q.copy(), sens, q - sens / 2.0, q + sens / 2.0, draws, seed=seed)

    groups = None
    if name in ("7", "8"):
        raw, groups = _polarised(rng, n, repeats, 0.5 if name == "7" else 3.0)
    else:
        raw = {"4": _scenario_4, "5": _scenario_5, "6": _scenario_6}[name](rng, n, repeats)
    p_lo, p_hi = _PERCENTILES[name]
    lo, hi = np.percentile(raw, [p_lo, p_hi], axis=0)
    sens = np.maximum(hi - lo, MIN_SENSITIVITY)
    draws = np.clip(raw, lo, hi)
    return Scenario(name, description, draws[0].copy(), sens, lo, hi, draws, groups=groups, seed=seed)
