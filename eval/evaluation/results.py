"""What a run returns: one evaluation (:class:`EvalResult`) and a whole sweep (:class:`SweepResult`).
Plain data with small queries; the plots and the report read these and nothing else of the harness."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from eval.evaluation.config import EvalConfig, level_dirname
from recsvc.policy import AUTO

_F, _I, _S = pl.Float64, pl.Int64, pl.String
# Aggregate tables: mse (per mechanism × ε), log_ratio_summary (per ε, only with gem and mgem), the histogram
MSE_SCHEMA = {"mechanism": _S, "epsilon": _F, "mse_mean": _F, "ci_low": _F, "ci_high": _F, "users": _I, "method": _S}
LOG_RATIO_SCHEMA = {
    **dict.fromkeys(("epsilon", "mean_log_ratio", "ci_low", "ci_high"), _F),
    **dict.fromkeys(("users_defined", "users_undefined"), _I),
}
HISTOGRAM_SCHEMA = {"bin_low": _F, "bin_high": _F, "spearman_users": _I, "weighted_users": _I}


@dataclass
class EvalResult:
    """Aggregates of one run; per-user tables are in ``out`` as Parquet."""

    config: EvalConfig
    dataset: str
    mechanisms: tuple[str, ...]
    epsilons: tuple[float, ...]
    users: int
    mse: pl.DataFrame  # MSE_SCHEMA
    correlation: dict[str, Any]
    log_ratio: pl.DataFrame  # LOG_RATIO_SCHEMA; empty without gem and mgem
    hist_edges: np.ndarray
    hist_spearman: np.ndarray
    hist_weighted: np.ndarray
    scatter: pl.DataFrame  # sample of users: spearman, weighted, log_ratio at ratio_epsilon
    ratio_epsilon: float
    seconds: float
    out: Path | None = None
    notes: list[str] = field(default_factory=list)
    pipelines: pl.DataFrame | None = None  # --pipelines: eval.evaluation.pipeline_report.TABLE_SCHEMA rows
    auto: pl.DataFrame = field(default_factory=pl.DataFrame)  # eval.evaluation.auto.regret_table; empty without auto
    auto_origin: str = ""  # where auto's policy table came from

    def winners(self) -> list[tuple[float, str, bool | None]]:
        """(ε, best fixed mechanism by mean MSE, whether its CI is clear of the runner-up's; None = no
        CI). ``auto`` is not a fixed mechanism: it is scored against these in :attr:`auto`."""
        rows = []
        for eps in self.epsilons:
            t = self.mse.filter((pl.col("epsilon") == eps) & (pl.col("mechanism") != AUTO)).sort("mse_mean")
            if t.height == 0:
                continue
            best = t.row(0, named=True)
            if t.height < 2:
                clear: bool | None = True
            else:
                hi, lo = best["ci_high"], t.row(1, named=True)["ci_low"]
                clear = None if not (math.isfinite(hi) and math.isfinite(lo)) else bool(hi < lo)
            rows.append((eps, best["mechanism"], clear))
        return rows


@dataclass(frozen=True)
class SweepLevel:
    """One level t of the sweep: its instances' correlation, the first instance (for the
    scatter) and the full single-level evaluation over all instances."""

    level: float
    spearman: float  # median over instances of Spearman ρ(q, Δ)
    scores: np.ndarray  # (n,) the first instance's scores
    sensitivities: np.ndarray  # (n,) and its Δ
    result: EvalResult

    @property
    def dirname(self) -> str:
        return level_dirname(self.level)


@dataclass
class SweepResult:
    """Every level of the sweep; ``table`` has one row per level × mechanism × ε."""

    config: EvalConfig
    levels: list[SweepLevel]
    table: pl.DataFrame  # level, spearman, mechanism, epsilon, mse, mse_rel_rnm, method
    seconds: float
    out: Path | None = None

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return self.levels[0].result.mechanisms

    @property
    def epsilons(self) -> tuple[float, ...]:
        return self.levels[0].result.epsilons

    @property
    def has_rnm(self) -> bool:
        return "rnm" in self.mechanisms

    def best_at(self, eps: float) -> list[tuple[SweepLevel, str, float, float]]:
        """Per level: (level, best mechanism by mean MSE at ε, its MSE, its MSE ÷ RNM's (NaN without rnm))."""
        rows = []
        for lv in self.levels:
            mech = next(m for e, m, _ in lv.result.winners() if e == eps)
            row = self.table.filter(
                (pl.col("level") == lv.level) & (pl.col("epsilon") == eps) & (pl.col("mechanism") == mech)
            ).row(0, named=True)
            rows.append((lv, mech, row["mse"], row["mse_rel_rnm"]))
        return rows
