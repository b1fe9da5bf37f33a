"""Figure 10: the sweep scenario at every level t, one results directory."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from operator import attrgetter
from pathlib import Path

import numpy as np
import polars as pl

from eval.evaluation import plots, report
from eval.evaluation import run as runner
from eval.evaluation.config import EvalConfig, level_dirname, protected, validate
from eval.evaluation.results import SweepLevel, SweepResult
from eval.evaluation.sources import ScenarioSource
from eval.scenarios import SWEEP_LEVELS
from eval.study import Output, Study, execute

TITLE = "Evaluation: correlation sweep (paper Figure 10)"
SWEEP_SCHEMA = {"level": pl.Float64, "spearman": pl.Float64, "mechanism": pl.String, "epsilon": pl.Float64}
SWEEP_SCHEMA |= {"mse": pl.Float64, "mse_rel_rnm": pl.Float64, "method": pl.String}
OUTPUTS = tuple(Output(name, attrgetter("table"), SWEEP_SCHEMA) for name in ("sweep.csv", "sweep.parquet"))


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
    work; ``cfg.out`` gets ``t<level>/`` per level (the main evaluation's files, each written while
    the sweep runs), the sweep's tables, ``sweep.png`` and ``report.md``, published together."""
    levels = _check_levels(cfg, SWEEP_LEVELS if levels is None else levels)
    # Flags, mechanisms and --out; --level needs the sweep scenario.
    mechanisms = validate(replace(cfg, level=levels[0]))
    # validate() refuses a level with --artifacts, so each level's source is the sweep scenario at that level;
    # a bad --n / --users fails here.
    sources = [ScenarioSource(str(cfg.scenario), cfg.n, cfg.users, cfg.seed, t) for t in levels]

    def compute(config: EvalConfig, tmp: Path | None) -> SweepResult:
        result, t0 = SweepResult(config, [], pl.DataFrame(), 0.0), time.perf_counter()
        for t, source in zip(levels, sources, strict=True):
            name = level_dirname(t)
            out, into = (None, None) if tmp is None or config.out is None else (config.out / name, tmp / name)
            res = runner.evaluate(replace(config, level=t, out=out, force=False), mechanisms, source, into)
            result.levels.append(SweepLevel(t, float(np.median(source.sc.correlation())), *source.sc.row(0), res))
        result.table, result.seconds = sweep_table(result.levels), time.perf_counter() - t0
        if tmp is not None:
            plots.sweep_figure(result, tmp / plots.SWEEP_PNG)
        return result

    return execute(
        Study(TITLE, EvalConfig, compute, OUTPUTS, report.sweep_markdown, streams=True, protect=protected),
        runner.with_data_defaults(cfg, sources[0]),
    )


def sweep_table(levels: Sequence[SweepLevel]) -> pl.DataFrame:
    """One row per level × mechanism × ε; ``mse_rel_rnm`` = MSE ÷ RNM's MSE at that ε (NaN without rnm)."""
    frames = []
    for lv in levels:
        mse = lv.result.mse
        rnm = dict(mse.filter(pl.col("mechanism") == "rnm").select("epsilon", "mse_mean").iter_rows())
        ref = np.array([rnm.get(e, np.nan) for e in mse["epsilon"].to_list()], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = mse["mse_mean"].to_numpy() / ref
        head = (pl.lit(lv.level).alias("level"), pl.lit(lv.spearman).alias("spearman"), "mechanism", "epsilon")
        frames.append(mse.select(*head, pl.col("mse_mean").alias("mse"), pl.Series("mse_rel_rnm", rel), "method"))
    return pl.concat(frames)
