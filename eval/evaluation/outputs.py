"""A run's results directory (staged, then published atomically): tables, plots, report, summary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import polars as pl

from eval.evaluation import pipeline_report, plots, report
from eval.evaluation.config import EvalConfig, param_values, protected
from eval.evaluation.results import EvalResult, SweepResult
from recsvc.staging import StagedDir

SWEEP_CSV = "sweep.csv"
SWEEP_PARQUET = "sweep.parquet"


@contextmanager
def staged(cfg: EvalConfig) -> Iterator[StagedDir | None]:
    """``cfg.out``'s staging directory (None without ``--out``): published by the caller, removed
    with the parents it created if the run fails."""
    if cfg.out is None:
        yield None
        return
    with StagedDir(cfg.out, cfg.force, protect=protected(cfg)) as stage:
        yield stage


def write_outputs(result: EvalResult, tmp: Path) -> None:
    """One run's aggregate tables, plots, ``summary.json`` and ``report.md`` (the per-user Parquet
    tables were streamed there by the reducer)."""
    result.mse.write_parquet(tmp / "mse.parquet")
    result.mse.write_csv(tmp / "mse.csv")
    if result.auto.height:
        result.auto.write_parquet(tmp / "auto_regret.parquet")
        result.auto.write_csv(tmp / "auto_regret.csv")
    if result.log_ratio.height:
        result.log_ratio.write_parquet(tmp / "log_ratio_summary.parquet")
        result.log_ratio.write_csv(tmp / "log_ratio_summary.csv")
    pl.DataFrame(
        {
            "bin_low": result.hist_edges[:-1],
            "bin_high": result.hist_edges[1:],
            "spearman_users": result.hist_spearman,
            "weighted_users": result.hist_weighted,
        }
    ).write_csv(tmp / "correlation_histogram.csv")
    plots.write_all(result, tmp)
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result.config).items()}
    cfg["params"] = param_values(result.config)  # what the run used: given or each spec's default
    summary = {
        "dataset": result.dataset,
        "users": result.users,
        "mechanisms": list(result.mechanisms),
        "epsilons": list(result.epsilons),
        "correlation": result.correlation,
        "config": cfg,
        "winners": [{"epsilon": e, "mechanism": m, "clear": c} for e, m, c in result.winners()],
        "seconds": result.seconds,
        "notes": result.notes,
    }
    if result.auto.height:
        summary["auto"] = {"origin": result.auto_origin, "regret": result.auto.to_dicts()}
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = report.markdown(result)
    if result.pipelines is not None:  # only with --pipelines: the default outputs stay as they were
        text += pipeline_report.write(result, tmp)
    (tmp / "report.md").write_text(text)


def write_sweep_outputs(result: SweepResult, tmp: Path) -> None:
    """The sweep's table, figure and ``report.md`` (each level's directory is already in ``tmp``)."""
    result.table.write_csv(tmp / SWEEP_CSV)
    result.table.write_parquet(tmp / SWEEP_PARQUET)
    plots.sweep_figure(result, tmp / plots.SWEEP_PNG)
    (tmp / "report.md").write_text(report.sweep_markdown(result))


def summary(result: EvalResult | SweepResult) -> tuple[str, Path | None]:
    """The short text summary for the terminal/demo and the path of ``report.md`` (if written)."""
    text = report.sweep_summary_text(result) if isinstance(result, SweepResult) else report.summary_text(result)
    return text, (result.out / "report.md" if result.out else None)
