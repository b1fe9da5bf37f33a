"""`recsvc eval-feature-selection`: the study declared on :mod:`eval.study` (its tables, summary.json,
plots and report), which validates, then writes every output at once."""

from __future__ import annotations

import time
from typing import Any

from eval.feature_selection import plots, report, study
from eval.feature_selection.config import FeatureSelectionConfig, validate
from eval.study import Output, Study, execute

FIGURE1_CSV = "figure1.csv"
ACCURACY_CSV = "accuracy.csv"
NONPRIVATE_CSV = "nonprivate.csv"
RATES_CSV = "rates.csv"
COMPARISONS_CSV = "comparisons.csv"
# summary.json's "config": what the run used (params given or defaulted)
_SUMMARY_CONFIG = (
    *("datasets", "settings", "ks", "epsilons", "trials", "repetitions"),
    *("neighbouring", "lasso_alpha", "mechanism", "params", "seed"),
)


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
    return {
        "config": {k: dict(cfg.params) if k == "params" else getattr(cfg, k) for k in _SUMMARY_CONFIG},
        "findings": [{"statement": f.statement, "holds": f.holds, "detail": f.detail} for f in result.findings],
        "seconds": result.seconds,
    }


STUDY = Study(
    title=report.TITLE,
    config=FeatureSelectionConfig,
    run=compute,
    outputs=(
        Output(FIGURE1_CSV, lambda r: r.figure1, study.FIGURE1_SCHEMA),
        Output(ACCURACY_CSV, lambda r: r.accuracy, study.ACCURACY_SCHEMA),
        Output(NONPRIVATE_CSV, lambda r: r.nonprivate, study.NONPRIVATE_SCHEMA),
        Output(RATES_CSV, lambda r: r.rates, study.RATES_SCHEMA),
        Output(COMPARISONS_CSV, lambda r: None if r.accuracy is None else r.comparisons, report.COMPARISON_SCHEMA),
        Output("summary.json", summary_json, ("config", "findings", "seconds")),
    ),
    report=report.body,
    plots=plots.figures,
    validate=validate,
)


def run(cfg: FeatureSelectionConfig) -> study.FeatureSelectionResult:
    return execute(STUDY, cfg)
