"""`recsvc eval-feature-selection`: the study declared on :mod:`eval.study` (its tables, summary.json,
plots and report), which validates, then writes every output at once."""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

from eval.feature_selection import plots, report, study
from eval.feature_selection.config import FeatureSelectionConfig, validate
from eval.study import Output, Study, execute


def compute(cfg: FeatureSelectionConfig) -> study.FeatureSelectionResult:
    """Figure 1's counts (with settings) and the accuracy study (with datasets), the claims checked."""
    t0 = time.perf_counter()
    fig1 = study.figure1_table(cfg) if cfg.settings else None
    runs, acc, nonpriv, rates = study.accuracy_tables(cfg) if cfg.datasets else ([], None, None, None)
    table = report.comparisons(cfg, runs)
    result = study.FeatureSelectionResult(
        cfg, fig1, acc, nonpriv, rates, table, report.findings(cfg, table), time.perf_counter() - t0
    )
    result.notes += [
        f"{r.name}: the Lasso's reference set has {len(r.references[k])} features at k = {k}, "
        f"so accuracy is at most {len(r.references[k]) / k:.0%}"
        for r in runs
        for k in cfg.ks
        if len(r.references[k]) < k
    ]
    return result


def summary_json(result: study.FeatureSelectionResult) -> dict[str, Any]:
    cfg = result.config
    used = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in ("out", "force", "progress")}
    return {
        "config": used | {"params": dict(cfg.params)},  # what the run used (params given or defaulted)
        "findings": [{"statement": f.statement, "holds": f.holds, "detail": f.detail} for f in result.findings],
        "seconds": result.seconds,
    }


STUDY = Study(
    title=report.TITLE,
    config=FeatureSelectionConfig,
    run=compute,
    outputs=(
        Output("figure1.csv", lambda r: r.figure1, study.FIGURE1_SCHEMA),
        Output("accuracy.csv", lambda r: r.accuracy, study.ACCURACY_SCHEMA),
        Output("nonprivate.csv", lambda r: r.nonprivate, study.NONPRIVATE_SCHEMA),
        Output("rates.csv", lambda r: r.rates, study.RATES_SCHEMA),
        Output("comparisons.csv", lambda r: None if r.accuracy is None else r.comparisons, report.COMPARISON_SCHEMA),
        Output("summary.json", summary_json, ("config", "findings", "seconds")),
    ),
    report=report.body,
    plots=plots.figures,
    validate=validate,
)


def run(cfg: FeatureSelectionConfig) -> study.FeatureSelectionResult:
    return execute(STUDY, cfg)
