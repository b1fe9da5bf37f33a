"""The bandit study's results directory: each table's file and schema (written by eval.study)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eval.bandit import tables
from eval.study import Output

if TYPE_CHECKING:
    from eval.bandit.results import BanditResult

OUTPUTS: tuple[Output[BanditResult], ...] = (
    Output("bandit.parquet", lambda r: r.curves, tables.CURVES_SCHEMA),
    Output("means.parquet", lambda r: r.means, tables.MEANS_SCHEMA),
    Output("quantiles.parquet", lambda r: r.quantiles, tables.QUANTILES_SCHEMA),
    Output("summary.csv", lambda r: r.summary, tables.SUMMARY_SCHEMA),
    Output("comparisons.csv", lambda r: r.comparisons, tables.COMPARISONS_SCHEMA),
    Output("ucb_readings.csv", lambda r: r.readings, tables.READINGS_SCHEMA),
)
