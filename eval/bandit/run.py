"""``recsvc eval-bandit``: the bandit study of §IX / Appendix H / Figure 14.

The study declared on :mod:`eval.study`, which validates the config (nothing is created on bad
input) and writes the results directory atomically; its computation maps the work units (every
policy and UCB reading × seed) over the local engine with a progress bar and builds the tables.
"""

from __future__ import annotations

import time

from eval.bandit import outputs, plots, report, tables
from eval.bandit.config import BanditConfig, validate
from eval.bandit.results import BanditResult
from eval.bandit.simulate import UnitResult, run_unit, unit_names
from eval.study import Study, execute
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
    outputs=outputs.OUTPUTS,
    report=report.body,
    plots=plots.figures,
    validate=validate,
)


def run(cfg: BanditConfig) -> BanditResult:
    return execute(STUDY, cfg)
