"""Figure 10: the sweep scenario at every level t, one results directory."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import polars as pl

from eval.evaluation import outputs
from eval.evaluation import run as runner
from eval.evaluation.config import EvalConfig, level_dirname, validate
from eval.evaluation.results import SweepLevel, SweepResult
from eval.evaluation.sources import ScenarioSource
from eval.scenarios import SWEEP_LEVELS


def _check_levels(cfg: EvalConfig, levels: Sequence[float]) -> tuple[float, ...]:
    if cfg.level is not None:
        raise ValueError(f"run_sweep takes the levels as its argument; expected cfg.level None, got {cfg.level!r}")
    if not levels:
        raise ValueError("no sweep level given; expected at least one t")
    for t in levels:
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and math.isfinite(t)):
            raise ValueError(f"sweep level must be a finite number, got {t!r}")
    names = [level_dirname(t) for t in levels]
    if len(set(names)) != len(names):
        raise ValueError(f"sweep levels must be distinct (as directory names), got {list(levels)}")
    return tuple(float(t) for t in levels)


def run_sweep(cfg: EvalConfig, levels: Sequence[float] | None = None) -> SweepResult:
    """Figure 10: one evaluation per sweep level (default the paper's seven) with the same seed,
    so each level equals a single run with the same flags. Everything is checked once before any
    work; ``cfg.out`` gets ``t<level>/`` per level, ``sweep.csv``/``.parquet``, ``sweep.png`` and
    ``report.md``, written to a temp sibling and renamed into place only when all levels are done."""
    levels = _check_levels(cfg, SWEEP_LEVELS if levels is None else levels)
    # Flags, mechanisms and --out; --level needs the sweep scenario.
    mechanisms = validate(replace(cfg, level=levels[0]))
    # validate() refuses a level with --artifacts, so each level's source is the sweep scenario at that level;
    # a bad --n / --users fails here.
    sources = [ScenarioSource(str(cfg.scenario), cfg.n, cfg.users, cfg.seed, t) for t in levels]
    cfg = runner.with_data_defaults(cfg, sources[0])
    t0 = time.perf_counter()
    with outputs.staged(cfg) as stage:
        done = []
        for t, source in zip(levels, sources, strict=True):
            sub = None if stage is None else stage.tmp / level_dirname(t)
            res = runner.evaluate(replace(cfg, level=t, out=sub, force=False), mechanisms, source)
            q0, d0 = source.sc.row(0)
            done.append(SweepLevel(t, float(np.median(source.sc.correlation())), q0, d0, res))
        result = SweepResult(cfg, done, sweep_table(done), time.perf_counter() - t0)
        if stage is not None:
            outputs.write_sweep_outputs(result, stage.tmp)
            result.out = stage.publish()
            for lv in done:
                lv.result.out = result.out / lv.dirname
        return result


def sweep_table(levels: Sequence[SweepLevel]) -> pl.DataFrame:
    """One row per level × mechanism × ε; ``mse_rel_rnm`` = MSE ÷ RNM's MSE at that ε (NaN without rnm)."""
    frames = []
    for lv in levels:
        mse = lv.result.mse
        rnm = dict(mse.filter(pl.col("mechanism") == "rnm").select("epsilon", "mse_mean").iter_rows())
        ref = np.array([rnm.get(e, np.nan) for e in mse["epsilon"].to_list()], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = mse["mse_mean"].to_numpy() / ref
        frames.append(
            pl.DataFrame(
                {
                    "level": np.full(mse.height, lv.level),
                    "spearman": np.full(mse.height, lv.spearman),
                    "mechanism": mse["mechanism"],
                    "epsilon": mse["epsilon"],
                    "mse": mse["mse_mean"],
                    "mse_rel_rnm": rel,
                    "method": mse["method"],
                }
            )
        )
    return pl.concat(frames)
