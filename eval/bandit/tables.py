"""The bandit study's result and its tables, built from the work units' results: curves, means,
quantiles, and summaries with 95% t-intervals over seeds (paired over seeds for differences:
every policy of a seed plays the same reward table)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import t as student_t

from eval.bandit import baselines
from eval.bandit.config import PRIVATE, BanditConfig
from eval.bandit.simulate import READING_PREFIX, UnitResult, sample_steps

QUANTITIES = ("reward_before", "reward_after", "reward_total", "best_share_before", "best_share_after")
NEVER_SWITCHING = READING_PREFIX + "greedy"  # the reading the comparisons below also use as "UCB"
_S, _I, _F = pl.String, pl.Int64, pl.Float64
CURVES_SCHEMA = {"policy": _S, "seed": _I, "t": _I, "cumulative_reward": _F}
MEANS_SCHEMA = {"policy": _S, "seed": _I, "t": _I, "arm": _I, "empirical_mean": _F, "private_mean": _F}
_WINDOWS_SCHEMA = {"policy": _S, "seed": _I, "arm": _I, "t": _I, "pulls": _I, "p10": _F, "p90": _F}
QUANTILES_SCHEMA = {**_WINDOWS_SCHEMA, "sensitivity": _F}
SUMMARY_SCHEMA = {"policy": _S, "quantity": _S, "mean": _F, "ci_low": _F, "ci_high": _F, "seeds": _I}
COMPARISONS_SCHEMA = {"policy": _S, "baseline": _S, "quantity": _S, "mean_difference": _F} | {
    "ci_low": _F,
    "ci_high": _F,
    "wins": _I,
    "seeds": _I,
}
READINGS_SCHEMA = {"reading": _S, "description": _S, "seeds": _I, "never_switched": _I} | {
    "switch_delay_median": _F,
    "switch_delay_max": _I,
    "first_new_best_median": _F,
    **dict.fromkeys(("best_share_after", "best_share_after_ci_low", "best_share_after_ci_high"), _F),
    **dict.fromkeys(("reward_after", "reward_after_ci_low", "reward_after_ci_high"), _F),
}


@dataclass
class BanditResult:
    config: BanditConfig
    units: list[UnitResult]
    curves: pl.DataFrame  # bandit.parquet
    means: pl.DataFrame
    quantiles: pl.DataFrame
    summary: pl.DataFrame
    comparisons: pl.DataFrame
    readings: pl.DataFrame
    seconds: float
    out: Path | None = None

    def value(self, policy: str, quantity: str) -> float:
        """The mean over seeds of one summary quantity (e.g. ``reward_after``) of one policy."""
        row = self.summary.filter((pl.col("policy") == policy) & (pl.col("quantity") == quantity))
        return float(row["mean"][0])


def ci(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval of the mean; NaN bounds for one value."""
    v = np.asarray(values, dtype=np.float64)
    m = float(v.mean())
    if v.size < 2:
        return m, float("nan"), float("nan")
    half = float(student_t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
    return m, m - half, m + half


def quantity(u: UnitResult, name: str) -> float:
    return u.reward_before + u.reward_after if name == "reward_total" else float(getattr(u, name))


def by_name(units: list[UnitResult]) -> dict[str, list[UnitResult]]:
    """Units grouped by policy / reading, each list in seed order."""
    out: dict[str, list[UnitResult]] = {}
    for u in sorted(units, key=lambda u: u.seed):
        out.setdefault(u.name, []).append(u)
    return out


def curves(units: list[UnitResult], cfg: BanditConfig) -> pl.DataFrame:
    """bandit.parquet: policy, seed, t, cumulative_reward at the recorded steps (incl. t_shift, T)."""
    grid = sample_steps(cfg.horizon, cfg.shift)
    rows = [u for u in units if not u.name.startswith(READING_PREFIX)]
    return pl.DataFrame(
        {
            "policy": np.repeat([u.name for u in rows], grid.size),
            "seed": np.repeat([u.seed for u in rows], grid.size).astype(np.int64),
            "t": np.tile(grid, len(rows)),
            "cumulative_reward": np.concatenate([u.cumulative for u in rows]) if rows else np.zeros(0),
        }
    )


def means(units: list[UnitResult], cfg: BanditConfig) -> pl.DataFrame:
    """means.parquet (Fig. 14(b)): policy, seed, t, arm, empirical_mean, private_mean."""
    grid = sample_steps(cfg.horizon, cfg.shift)
    rows = [u for u in units if not u.name.startswith(READING_PREFIX)]
    return pl.DataFrame(
        {
            "policy": np.repeat([u.name for u in rows], 2 * grid.size),
            "seed": np.repeat([u.seed for u in rows], 2 * grid.size).astype(np.int64),
            "t": np.tile(grid, 2 * len(rows)),
            "arm": np.tile(np.repeat(np.arange(2, dtype=np.int64), grid.size), len(rows)),
            "empirical_mean": np.concatenate([u.empirical.T.ravel() for u in rows]),
            "private_mean": np.concatenate([u.scores.T.ravel() for u in rows]),
        }
    )


def quantiles(units: list[UnitResult]) -> pl.DataFrame:
    """quantiles.parquet (Fig. 14(c)/(d)): one row per window: policy, seed, arm, t, pulls, p10, p90, sensitivity."""
    parts = [
        pl.DataFrame(
            {
                "policy": u.name,
                "seed": u.seed,
                "arm": u.quantiles[:, 0].astype(np.int64),
                "t": u.quantiles[:, 1].astype(np.int64),
                "pulls": u.quantiles[:, 2].astype(np.int64),
                "p10": u.quantiles[:, 3],
                "p90": u.quantiles[:, 4],
            }
        )
        for u in units
        if u.quantiles.shape[0]
    ]
    df = pl.concat(parts).with_columns(pl.col("seed").cast(pl.Int64)) if parts else pl.DataFrame(schema=_WINDOWS_SCHEMA)
    return df.with_columns(sensitivity=(pl.col("p90") - pl.col("p10")).abs())


def summary(units: list[UnitResult], cfg: BanditConfig) -> pl.DataFrame:
    """summary.csv: policy × quantity → mean and 95% CI over seeds."""
    groups = by_name(units)
    rows = [
        (name, q, *ci(np.array([quantity(u, q) for u in groups[name]])), len(groups[name]))
        for name in [*cfg.policies, *(n for n in groups if n.startswith(READING_PREFIX))]
        for q in QUANTITIES
    ]
    return pl.DataFrame(rows, schema=SUMMARY_SCHEMA, orient="row")


def _paired(groups: dict[str, list[UnitResult]], a: str, b: str, q: str) -> tuple:
    """A comparisons.csv row: ``a`` − ``b`` in quantity ``q``, paired over seeds."""
    d = np.array([quantity(x, q) - quantity(y, q) for x, y in zip(groups[a], groups[b], strict=True)])
    return (a, b, q, *ci(d), int((d > 0).sum()), d.size)


def comparisons(units: list[UnitResult], cfg: BanditConfig) -> pl.DataFrame:
    """comparisons.csv: paired differences (policy − baseline) over seeds for the paper's claims:
    UCB vs every private policy before the shift; every private policy vs UCB (stated, and the
    never-switching reading) after it; mGEM vs GEM over the whole run."""
    g = by_name(units)
    private = [p for p in cfg.policies if p in PRIVATE]
    rows = []
    if "ucb" in g:
        rows += [_paired(g, "ucb", p, "reward_before") for p in private]
        rows += [_paired(g, p, "ucb", "reward_after") for p in private]
    if NEVER_SWITCHING in g:
        rows += [_paired(g, p, NEVER_SWITCHING, "reward_after") for p in private]
    if "mgem" in g and "gem" in g:
        rows += [_paired(g, "mgem", "gem", q) for q in ("reward_before", "reward_after", "reward_total")]
    return pl.DataFrame(rows, schema=COMPARISONS_SCHEMA, orient="row")


def readings(units: list[UnitResult]) -> pl.DataFrame:
    """ucb_readings.csv: per UCB reading, does it switch after the shift, and what it earns."""
    g = by_name(units)
    rows = []
    for reading, text in baselines.READINGS.items():
        us = g.get("ucb" if reading == "stated" else READING_PREFIX + reading)
        if not us:
            continue
        delays = [u.switch_delay for u in us if u.switch_delay is not None]
        firsts = [u.first_new_best for u in us if u.first_new_best is not None]
        rows.append(
            (  # READINGS_SCHEMA's columns
                reading,
                text,
                len(us),
                len(us) - len(delays),
                float(np.median(delays)) if delays else None,
                max(delays) if delays else None,
                float(np.median(firsts)) if firsts else None,
                *ci(np.array([u.best_share_after for u in us])),
                *ci(np.array([u.reward_after for u in us])),
            )
        )
    return pl.DataFrame(rows, schema=READINGS_SCHEMA, orient="row")
