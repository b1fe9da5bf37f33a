"""`recsvc eval-feature-selection`: validate, compute, then write every output at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

from eval.feature_selection import plots, report, study
from eval.feature_selection.config import FeatureSelectionConfig, validate
from eval.study import publish

FIGURE1_CSV = "figure1.csv"
ACCURACY_CSV = "accuracy.csv"
NONPRIVATE_CSV = "nonprivate.csv"
RATES_CSV = "rates.csv"
COMPARISONS_CSV = "comparisons.csv"


def run(cfg: FeatureSelectionConfig) -> report.FeatureSelectionResult:
    """Every check first (nothing is created on bad input); the outputs are written to a temp
    sibling of ``cfg.out`` and renamed into place, so a failed run leaves nothing."""
    cfg = validate(cfg)
    t0 = time.perf_counter()
    fig1 = study.figure1_table(cfg) if cfg.settings else None
    runs, acc, nonpriv, rates = study.accuracy_tables(cfg) if cfg.datasets else ([], None, None, None)
    table = report.comparisons(cfg, runs)
    result = report.FeatureSelectionResult(
        cfg, fig1, acc, nonpriv, rates, table, report.findings(cfg, table), time.perf_counter() - t0
    )
    result.notes += [
        f"{r.name}: the Lasso's reference set has {len(r.references[k])} features at k = {k}, "
        f"so accuracy is at most {len(r.references[k]) / k:.0%}"
        for r in runs
        for k in cfg.ks
        if len(r.references[k]) < k
    ]
    return publish(result, _write)


def _write(result: report.FeatureSelectionResult, tmp: Path) -> None:
    cfg, figures = result.config, []
    if result.figure1 is not None:
        result.figure1.write_csv(tmp / FIGURE1_CSV)
        plots.figure1(result.figure1, cfg.repetitions, tmp / plots.FIGURE1_PNG)
        figures.append(plots.FIGURE1_PNG)
    if result.accuracy is not None and result.nonprivate is not None and result.rates is not None:
        result.accuracy.write_csv(tmp / ACCURACY_CSV)
        result.nonprivate.write_csv(tmp / NONPRIVATE_CSV)
        result.rates.write_csv(tmp / RATES_CSV)
        result.comparisons.write_csv(tmp / COMPARISONS_CSV)
        plots.accuracy(result.accuracy, result.nonprivate, tmp / plots.ACCURACY_PNG)
        plots.rates(result.rates, tmp / plots.RATES_PNG)
        figures += [plots.ACCURACY_PNG, plots.RATES_PNG]
    settings = {
        "datasets": list(cfg.datasets),
        "settings": list(cfg.settings),
        "ks": list(cfg.ks),
        "epsilons": list(cfg.epsilons),
        "trials": cfg.trials,
        "repetitions": cfg.repetitions,
        "neighbouring": cfg.neighbouring,
        "lasso_alpha": cfg.lasso_alpha,
        "mechanism": cfg.mechanism,
        "params": dict(cfg.params),
        "seed": cfg.seed,
    }
    summary = {
        "config": settings,
        "findings": [{"statement": f.statement, "holds": f.holds, "detail": f.detail} for f in result.findings],
        "seconds": result.seconds,
    }
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (tmp / "report.md").write_text(report.markdown(result))
    result.figures = tuple(figures)
