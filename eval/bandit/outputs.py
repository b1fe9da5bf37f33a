"""The bandit study's results directory (filled inside a StagedDir, published by ``run``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eval.bandit import plots, report

if TYPE_CHECKING:
    from eval.bandit.results import BanditResult

CURVES = "bandit.parquet"


def write(result: BanditResult, tmp: Path) -> None:
    """Tables (Parquet/CSV), Figure 14(a)–(d) and report.md into the staging directory ``tmp``."""
    result.curves.write_parquet(tmp / CURVES)
    result.means.write_parquet(tmp / "means.parquet")
    result.quantiles.write_parquet(tmp / "quantiles.parquet")
    result.summary.write_csv(tmp / "summary.csv")
    result.comparisons.write_csv(tmp / "comparisons.csv")
    result.readings.write_csv(tmp / "ucb_readings.csv")
    plots.write_all(result, tmp)
    (tmp / "report.md").write_text(report.markdown(result))
