"""The bandit study's result: the work units and the tables built from them (a type only, so
that plots and report need not import the runner)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from eval.bandit.config import BanditConfig
from eval.bandit.simulate import UnitResult


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
