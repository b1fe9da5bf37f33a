"""`recsvc eval-two-candidates`: the exact HG table, its heatmaps and report, written atomically."""

from __future__ import annotations

import time
from pathlib import Path

from eval.study import publish
from eval.two_candidates import plots, report
from eval.two_candidates.hg import HG_PARQUET, TwoCandidateConfig, TwoCandidateResult, findings, hg_table, validate


def run_two_candidates(cfg: TwoCandidateConfig) -> TwoCandidateResult:
    """Validates, computes ``hg.parquet`` exactly, writes it with the heatmaps and ``report.md``
    to ``cfg.out`` atomically (a temp sibling renamed into place; nothing is left on failure)."""
    cfg = validate(cfg)
    t0 = time.perf_counter()
    table = hg_table(cfg)
    return publish(TwoCandidateResult(cfg, table, findings(table, cfg), time.perf_counter() - t0), _write)


def _write(result: TwoCandidateResult, tmp: Path) -> None:
    result.table.write_parquet(tmp / HG_PARQUET)
    result.figures = plots.write_all(result, tmp)
    (tmp / "report.md").write_text(report.markdown(result))
