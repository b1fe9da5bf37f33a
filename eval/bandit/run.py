"""``recsvc eval-bandit``: the bandit study of §IX / Appendix H / Figure 14.

:func:`run` validates the config (nothing is created on bad input), maps the work units (every
policy and UCB reading × seed) over the local engine with a progress bar, builds the tables and
writes the results directory atomically through :class:`recsvc.staging.StagedDir`.
"""

from __future__ import annotations

import time

from eval.bandit import outputs, tables
from eval.bandit.config import BanditConfig, validate
from eval.bandit.results import BanditResult
from eval.bandit.simulate import UnitResult, run_unit, unit_names
from recsvc.engines import make_engine
from recsvc.staging import StagedDir


def simulate(cfg: BanditConfig) -> list[UnitResult]:
    """Every (seed, policy or UCB reading) unit, in a fixed order whatever the engine."""
    units = [(seed, name) for seed in range(cfg.seeds) for name in unit_names(cfg)]
    engine = make_engine("local", cfg.workers, progress=cfg.progress)
    try:
        return list(engine.map(run_unit, units, cfg, desc="eval-bandit", unit="step", sizes=[cfg.horizon] * len(units)))
    finally:
        engine.close()


def run(cfg: BanditConfig) -> BanditResult:
    """Validates, simulates, and (with ``cfg.out``) writes the results directory atomically."""
    validate(cfg)
    t0 = time.perf_counter()
    units = simulate(cfg)
    result = BanditResult(
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
    if cfg.out is not None:
        with StagedDir(cfg.out, cfg.force) as stage:
            outputs.write(result, stage.tmp)
            result.out = stage.publish()
    return result
