"""`recsvc eval-two-candidates`: the exact HG table, its heatmaps and report, written atomically."""

from __future__ import annotations

import time

from eval.two_candidates import plots, report
from eval.two_candidates.hg import HG_PARQUET, TwoCandidateConfig, TwoCandidateResult, findings, hg_table, validate
from recsvc.staging import StagedDir


def run_two_candidates(cfg: TwoCandidateConfig) -> TwoCandidateResult:
    """Validates, computes ``hg.parquet`` exactly, writes it with the heatmaps and ``report.md``
    to ``cfg.out`` atomically (a temp sibling renamed into place; nothing is left on failure)."""
    cfg = validate(cfg)
    t0 = time.perf_counter()
    table = hg_table(cfg)
    result = TwoCandidateResult(cfg, table, findings(table, cfg), time.perf_counter() - t0)
    if cfg.out is None:
        return result
    with StagedDir(cfg.out, cfg.force) as stage:
        table.write_parquet(stage.tmp / HG_PARQUET)
        result.figures = plots.write_all(result, stage.tmp)
        (stage.tmp / "report.md").write_text(report.markdown(result))
        result.out = stage.publish()
    return result
