"""The study's computations: Figure 1's selection counts and the accuracy study's tables.

Randomness: every dataset, repetition and trial draws from its own seeded stream
(``SeedSequence(seed, spawn_key=(part, …))``), keyed by the dataset's or setting's place in
:data:`eval.feature_selection.data.DATASETS` / ``SETTINGS``, so its numbers do not depend on which
others the run includes. Within a trial the selections are drawn in a fixed order (k, then ε, then
DP-SIS before two-stage), so they do depend on the k and ε grids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from eval.feature_selection import data, methods, metrics
from eval.feature_selection.config import FeatureSelectionConfig
from eval.study import Finding
from recsvc.engines import progress_bar as _bar
from recsvc.rng import stream

if TYPE_CHECKING:
    from tqdm.auto import tqdm

PRIVATE_METHODS = ("dp-sis", "two-stage")
NONPRIVATE_METHODS = ("sis", "two-stage")  # also Figure 1's
_FIGURE1, _DATASET, _TRIAL = 1, 2, 3  # the first spawn-key entry of each kind of stream

FIGURE1_SCHEMA = {"setting": pl.String, "method": pl.String, "feature": pl.Int64, "count": pl.Int64}
ACCURACY_SCHEMA = {
    "dataset": pl.String,
    "method": pl.String,
    "k": pl.Int64,
    "epsilon": pl.Float64,
    "accuracy": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
}
NONPRIVATE_SCHEMA = {k: v for k, v in ACCURACY_SCHEMA.items() if k != "epsilon"}
RATES_SCHEMA = {
    "dataset": pl.String,
    "k": pl.Int64,
    "epsilon": pl.Float64,
    "class": pl.String,
    "rate": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
}


def progress_bar(desc: str, unit: str, total: int, progress: bool | None) -> tqdm:
    """The shared progress bar; ``progress`` None lets tqdm decide (off when not a TTY)."""
    return _bar(desc, unit, total, None if progress is None else not progress)


def figure1_selections(dataset: data.Dataset, alpha: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The five features non-private SIS (DP-SIS's scores, no noise) and non-private two-stage
    (the top counts over the 10 blocks, in row order) choose."""
    x, y = data.max_abs(dataset.x, dataset.y)
    xs, ys = data.standardised(dataset.x, dataset.y)
    counts = methods.support_counts(xs, ys, methods.blocks(xs.shape[0]), alpha)
    return {
        "sis": methods.top_k(methods.sis_scores(x, y), data.FIGURE1_INFORMATIVE, rng),
        "two-stage": methods.top_k(counts, data.FIGURE1_INFORMATIVE, rng),
    }


def figure1_table(cfg: FeatureSelectionConfig) -> pl.DataFrame:
    """Per setting, method and feature (1-based, as the seed numbers them): how many of the
    repetitions chose it."""
    d = data.FIGURE1_SHAPE[1]
    rows: list[tuple[str, str, int, int]] = []
    with progress_bar("figure 1", "dataset", len(cfg.settings) * cfg.repetitions, cfg.progress) as bar:
        for setting in cfg.settings:
            counts = {m: np.zeros(d, dtype=np.int64) for m in NONPRIVATE_METHODS}
            for rep in range(cfg.repetitions):
                rng = stream(cfg.seed, _FIGURE1, data.SETTINGS.index(setting), rep)
                chosen = figure1_selections(data.figure1(setting, rng), cfg.lasso_alpha, rng)
                for m in NONPRIVATE_METHODS:
                    counts[m][chosen[m]] += 1
                bar.update()
            rows += [(setting, m, j + 1, int(counts[m][j])) for m in NONPRIVATE_METHODS for j in range(d)]
    return pl.DataFrame(rows, schema=FIGURE1_SCHEMA, orient="row")


@dataclass
class DatasetRun:
    """One dataset's raw outcomes: per (method, k index, ε index) the trials' accuracies, per
    (method, k index) the non-private ones, and DP-SIS's class hits per (class, k index, ε index)."""

    name: str
    shape: tuple[int, int]
    private: dict[str, np.ndarray]  # method → (K, E, T)
    nonprivate: dict[str, np.ndarray]  # method → (K, T)
    classes: dict[str, np.ndarray]  # class → (K, E, T) bool
    references: dict[int, np.ndarray]  # k → the Lasso reference set


def run_dataset(cfg: FeatureSelectionConfig, name: str, tick: Callable[[], object] = lambda: None) -> DatasetRun:
    index = data.DATASETS.index(name)
    ds = data.load(name, stream(cfg.seed, _DATASET, index))
    x, y = data.max_abs(ds.x, ds.y)
    xs, ys = data.standardised(ds.x, ds.y)
    n_rows = x.shape[0]
    scores = methods.sis_scores(x, y)
    refs = {k: methods.lasso_reference(xs, ys, k, cfg.lasso_alpha) for k in cfg.ks}
    sis_delta = methods.SIS_SENSITIVITY[cfg.neighbouring]
    count_delta = methods.COUNT_SENSITIVITY[cfg.neighbouring]
    shape_p, shape_np = (len(cfg.ks), len(cfg.epsilons), cfg.trials), (len(cfg.ks), cfg.trials)
    private = {m: np.empty(shape_p) for m in PRIVATE_METHODS}
    nonprivate = {m: np.empty(shape_np) for m in NONPRIVATE_METHODS}
    hits = {c: np.empty(shape_p, dtype=bool) for c in metrics.CLASSES}
    for t in range(cfg.trials):
        rng = stream(cfg.seed, _TRIAL, index, t)
        parts = methods.blocks(n_rows, rng)
        counts = methods.support_counts(xs, ys, parts, cfg.lasso_alpha)
        for i, k in enumerate(cfg.ks):
            nonprivate["sis"][i, t] = metrics.accuracy(methods.top_k(scores, k, rng), refs[k], k)
            nonprivate["two-stage"][i, t] = metrics.accuracy(methods.top_k(counts, k, rng), refs[k], k)
            for e, eps in enumerate(cfg.epsilons):
                sel = methods.private_top_k(scores, n_rows, sis_delta, eps, k, rng, cfg.mechanism, cfg.params)
                private["dp-sis"][i, e, t] = metrics.accuracy(sel, refs[k], k)
                for c, hit in metrics.rank_classes(sel, scores, k).items():
                    hits[c][i, e, t] = bool(hit[0])
                sel = methods.private_top_k(counts, len(parts), count_delta, eps, k, rng, cfg.mechanism, cfg.params)
                private["two-stage"][i, e, t] = metrics.accuracy(sel, refs[k], k)
        tick()
    return DatasetRun(name, (n_rows, x.shape[1]), private, nonprivate, hits, refs)


def accuracy_tables(cfg: FeatureSelectionConfig) -> tuple[list[DatasetRun], pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(the runs, accuracy.csv's table, nonprivate.csv's, rates.csv's)."""
    with progress_bar("accuracy", "trial", len(cfg.datasets) * cfg.trials, cfg.progress) as bar:
        runs = [run_dataset(cfg, name, bar.update) for name in cfg.datasets]
    acc, nonpriv, rates = [], [], []  # rows in their schema's column order
    for r in runs:
        for i, k in enumerate(cfg.ks):
            nonpriv += [(r.name, m, k, *metrics.interval(r.nonprivate[m][i])) for m in NONPRIVATE_METHODS]
            for e, eps in enumerate(cfg.epsilons):
                acc += [(r.name, m, k, eps, *metrics.interval(r.private[m][i, e])) for m in PRIVATE_METHODS]
                rates += [(r.name, k, eps, c, *metrics.rate_interval(r.classes[c][i, e])) for c in metrics.CLASSES]
    return (
        runs,
        pl.DataFrame(acc, schema=ACCURACY_SCHEMA, orient="row"),
        pl.DataFrame(nonpriv, schema=NONPRIVATE_SCHEMA, orient="row"),
        pl.DataFrame(rates, schema=RATES_SCHEMA, orient="row"),
    )


@dataclass
class FeatureSelectionResult:
    config: FeatureSelectionConfig
    figure1: pl.DataFrame | None
    accuracy: pl.DataFrame | None
    nonprivate: pl.DataFrame | None
    rates: pl.DataFrame | None
    comparisons: pl.DataFrame
    findings: list[Finding]
    seconds: float
    out: Path | None = None
    notes: list[str] = field(default_factory=list)
