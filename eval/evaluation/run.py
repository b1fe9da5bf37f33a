"""Evaluation harness: every mechanism × ε on every user, chunked over an engine
(docs/reference/specification.md §6).

:func:`run` validates the config, builds the data source, maps the work unit
(:func:`eval.evaluation.work.evaluate_chunk`) over lazy chunks, reduces the results in order
(:mod:`eval.evaluation.aggregate`) and writes the results directory atomically (:func:`eval.study.execute`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from eval.evaluation import aggregate, outputs
from eval.evaluation.auto import plan, regret_table
from eval.evaluation.config import EvalConfig, chunk_size, validate
from eval.evaluation.results import EvalResult
from eval.evaluation.sources import ArtifactSource, LazyChunks, Source, open_source
from eval.evaluation.work import evaluate_chunk, make_context
from eval.study import execute
from recsvc.engines import chunk_ranges, make_engine


def run(cfg: EvalConfig) -> EvalResult:
    """Validates everything, evaluates all users, writes ``cfg.out`` atomically (if set)."""
    mechanisms = validate(cfg)
    # A missing / corrupt artifact or a bad scenario size fails here, before any work.
    return evaluate(cfg, mechanisms, open_source(cfg))


def with_data_defaults(cfg: EvalConfig, source: Source) -> EvalConfig:
    """``cfg`` with an unset γ (None) replaced by the data's own: the artifact manifest's
    ``default_gamma`` (the paper's γ for that dataset) or 0.05 for a synthetic scenario."""
    if cfg.params.get("gamma") is not None:
        return cfg
    return replace(cfg, params={**cfg.params, "gamma": source.default_gamma})


def evaluate(cfg: EvalConfig, mechanisms: tuple[str, ...], source: Source, into: Path | None = None) -> EvalResult:
    """:func:`run` after validation, on the already built data source (``into``: see
    :func:`eval.study.execute`)."""
    cfg = with_data_defaults(cfg, source)
    size = chunk_size(cfg, source.total)
    cfg = replace(cfg, chunk_size=size)  # the report records the size used
    auto = plan(cfg, mechanisms, source)  # `auto` from the public policy table (or refused), before any output
    mechanisms = auto.mechanisms
    # validate() refuses --pipelines without --artifacts: only an artifact has the catalog's scores.
    catalog = source.catalog_items() if cfg.pipelines and isinstance(source, ArtifactSource) else None
    ctx = make_context(cfg, mechanisms, catalog, auto.resolved)
    ranges = chunk_ranges(source.total, size)
    eps = ctx.epsilons
    ratio_idx = int(np.argmin(np.abs(np.log(np.array(eps)) - math.log(cfg.ratio_epsilon))))
    engine = make_engine(cfg.engine, cfg.workers, cfg.scheduler, progress=cfg.progress)  # validates, no I/O

    def compute(cfg: EvalConfig, tmp: Path | None) -> EvalResult:  # only now, after every check, is anything written
        red = aggregate.Reducer(mechanisms, eps, source.total, cfg.seed, ratio_idx, tmp, pipelines=ctx.pipelines)
        t0 = time.perf_counter()
        sizes = [len(r) for r in ranges]
        for res in engine.map(
            evaluate_chunk, LazyChunks(source, ranges), ctx, desc=f"eval {source.name}", unit="user", sizes=sizes
        ):
            red.add(res)
        red.close()
        result = aggregate.finish(cfg, source.name, mechanisms, red, time.perf_counter() - t0)
        result.auto, result.auto_origin = regret_table(result.mse, auto.resolved), auto.origin
        result.notes += auto.notes
        if tmp is not None:
            outputs.write_summary(result, tmp)
        return result

    try:
        return execute(outputs.study(compute), cfg, into)
    finally:
        engine.close()
