"""``recsvc eval-bandit`` declared on :mod:`eval.study`: the work units (every policy and UCB
reading × seed) mapped over the local engine, and the tables and files built from them."""

from __future__ import annotations

import time

from eval.bandit import plots, report, tables
from eval.bandit.config import BanditConfig, validate
from eval.bandit.simulate import UnitResult, run_unit, unit_names
from eval.bandit.tables import BanditResult
from eval.study import Output, Study, execute
from recsvc.engines import make_engine


def simulate(cfg: BanditConfig) -> list[UnitResult]:
    """Every (seed, policy or UCB reading) unit, in a fixed order whatever the engine."""
    units = [(seed, name) for seed in range(cfg.seeds) for name in unit_names(cfg)]
    engine = make_engine("local", cfg.workers, progress=cfg.progress)
    try:
        return list(engine.map(run_unit, units, cfg, desc="eval-bandit", unit="step", sizes=[cfg.horizon] * len(units)))
    finally:
        engine.close()


def compute(cfg: BanditConfig) -> BanditResult:
    t0 = time.perf_counter()
    units = simulate(cfg)
    return BanditResult(
        cfg,
        units,
        tables.curves(units, cfg),
        tables.means(units, cfg),
        tables.quantiles(units),
        tables.summary(units, cfg),
        tables.comparisons(units, cfg),
        tables.readings(units),
        time.perf_counter() - t0,
    )


STUDY = Study(
    title=report.TITLE,
    config=BanditConfig,
    run=compute,
    outputs=(
        Output("bandit.parquet", lambda r: r.curves, tables.CURVES_SCHEMA),
        Output("means.parquet", lambda r: r.means, tables.MEANS_SCHEMA),
        Output("quantiles.parquet", lambda r: r.quantiles, tables.QUANTILES_SCHEMA),
        Output("summary.csv", lambda r: r.summary, tables.SUMMARY_SCHEMA),
        Output("comparisons.csv", lambda r: r.comparisons, tables.COMPARISONS_SCHEMA),
        Output("ucb_readings.csv", lambda r: r.readings, tables.READINGS_SCHEMA),
    ),
    report=report.body,
    plots=plots.figures,
    validate=validate,
)


def run(cfg: BanditConfig) -> BanditResult:
    return execute(STUDY, cfg)
