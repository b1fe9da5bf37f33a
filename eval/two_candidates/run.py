"""`recsvc eval-two-candidates` declared on :mod:`eval.study`: ``hg.parquet``, heatmaps, ``report.md``."""

from __future__ import annotations

import time

from eval.study import Output, Study, execute
from eval.two_candidates import hg, plots, report
from eval.two_candidates.hg import TwoCandidateConfig, TwoCandidateResult


def compute(cfg: TwoCandidateConfig) -> TwoCandidateResult:
    """The exact HG table and the paper's statements checked on it."""
    t0 = time.perf_counter()
    table = hg.hg_table(cfg)
    return TwoCandidateResult(cfg, table, hg.findings(table, cfg), time.perf_counter() - t0)


STUDY = Study(
    title=report.TITLE,
    config=TwoCandidateConfig,
    run=compute,
    outputs=(Output(hg.HG_PARQUET, lambda r: r.table, hg.HG_SCHEMA),),
    report=report.body,
    plots=plots.figures,
    validate=hg.validate,
)


def run_two_candidates(cfg: TwoCandidateConfig) -> TwoCandidateResult:
    return execute(STUDY, cfg)
