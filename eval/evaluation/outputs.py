"""A run's results directory (staged, then published atomically): tables declared with their schemas
(:class:`eval.study.Output`, checked by :func:`eval.study.write_output`), figures, summary, report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import polars as pl

from eval.evaluation import pipeline_report, report
from eval.evaluation.auto import REGRET_SCHEMA
from eval.evaluation.config import EvalConfig, param_values, protected
from eval.evaluation.pipeline_report import TABLE, TABLE_SCHEMA, WINNERS, WINNERS_SCHEMA
from eval.evaluation.plots import figures
from eval.evaluation.report import markdown
from eval.evaluation.results import HISTOGRAM_SCHEMA, LOG_RATIO_SCHEMA, MSE_SCHEMA, EvalResult, SweepResult
from eval.study import Output, Study, write_output

SUMMARY_KEYS = ("dataset", "users", "mechanisms", "epsilons", "correlation", "config", "winners", "seconds", "notes")


def _histogram(result: EvalResult) -> pl.DataFrame:
    edges, columns = result.hist_edges, (result.hist_spearman, result.hist_weighted)
    return pl.DataFrame([edges[:-1], edges[1:], *columns], schema=HISTOGRAM_SCHEMA, orient="col")


def _both(name: str, data, schema) -> tuple[Output[EvalResult], ...]:
    """``name``.parquet and ``name``.csv of one table."""
    return Output(f"{name}.parquet", data, schema), Output(f"{name}.csv", data, schema)


OUTPUTS: tuple[Output[EvalResult], ...] = (  # None: not in this run (no auto, no gem+mgem, no --pipelines)
    *_both("mse", lambda r: r.mse, MSE_SCHEMA),
    *_both("auto_regret", lambda r: r.auto if r.auto.height else None, REGRET_SCHEMA),
    *_both("log_ratio_summary", lambda r: r.log_ratio if r.log_ratio.height else None, LOG_RATIO_SCHEMA),
    Output("correlation_histogram.csv", _histogram, HISTOGRAM_SCHEMA),
    *_both(TABLE, lambda r: r.pipelines, TABLE_SCHEMA),
    Output(WINNERS, lambda r: None if r.pipelines is None else pipeline_report.winners(r.pipelines), WINNERS_SCHEMA),
)


def write_summary(result: EvalResult, tmp: Path) -> None:
    """``summary.json`` (its ``auto`` key only for a run with auto)."""
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
    write_output(tmp / "summary.json", summary, (*SUMMARY_KEYS, "auto") if "auto" in summary else SUMMARY_KEYS)


def study(run: Callable[[EvalConfig, Path | None], EvalResult]) -> Study[EvalConfig, EvalResult]:
    """One run as a streaming study: ``run`` fills the staged directory DURING the run (the per-user
    tables, then :func:`write_summary`); the declared tables, figures and ``report.md`` (its own
    layout, ``skeleton=False``) follow."""
    return Study(
        "Evaluation", EvalConfig, run, OUTPUTS, markdown, figures, streams=True, skeleton=False, protect=protected
    )


def summary(result: EvalResult | SweepResult) -> tuple[str, Path | None]:
    """The short text summary for the terminal/demo (ending with the path of ``report.md`` if written) and that path."""
    text = report.sweep_summary_text(result) if isinstance(result, SweepResult) else report.summary_text(result)
    path = result.out / "report.md" if result.out else None
    return (text if path is None else f"{text}\nreport: {path}"), path
