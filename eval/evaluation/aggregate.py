"""In-order reduction of chunk results into bounded running aggregates, and the run's result.

Chunks are reduced in order while per-user rows stream to Parquet, so memory does not grow with
the number of users. The mGEM/GEM log-ratio is the paper's per-user metric (mGEM vs GEM).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from eval import metrics
from eval.evaluation.config import EvalConfig
from eval.evaluation.pipeline_report import PipelineReducer
from eval.evaluation.results import LOG_RATIO_SCHEMA, MSE_SCHEMA, EvalResult
from eval.evaluation.work import ChunkResult
from eval.metrics import RunningMean
from recsvc.mechanisms import MECHANISMS

HIST_BINS = 40  # correlation histogram bins on [-1, 1]
SCATTER_USERS = 10_000  # Figure 13 shows 10,000 random test users


class Reducer:
    """Running aggregates of the chunks added so far; per-user Parquet tables go to ``tmp`` (if set)."""

    def __init__(
        self, mechanisms, epsilons, total: int, seed: int, ratio_eps_idx: int, tmp: Path | None, pipelines=None
    ) -> None:
        self.mechanisms, self.epsilons = mechanisms, epsilons
        M, E = len(mechanisms), len(epsilons)
        self.mse = RunningMean((M, E))
        self.ratio = RunningMean((E,))
        self.ratio_undefined = np.zeros(E, dtype=np.int64)
        self.edges = np.linspace(-1.0, 1.0, HIST_BINS + 1)
        self.h_s = np.zeros(HIST_BINS, dtype=np.int64)
        self.h_w = np.zeros(HIST_BINS, dtype=np.int64)
        self.pos = {"spearman": 0, "weighted": 0}
        self.undefined = {"spearman": 0, "weighted": 0}
        self.corr_mean = RunningMean((2,))
        self.users = 0
        self.exact = np.zeros(M, dtype=bool)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2**31,)))
        pick = rng.choice(total, SCATTER_USERS, replace=False) if total > SCATTER_USERS else np.arange(total)
        self.scatter_pick = np.sort(pick)
        self.scatter: list[pl.DataFrame] = []
        self.ratio_eps_idx = ratio_eps_idx
        self.has_ratio = "gem" in mechanisms and "mgem" in mechanisms
        self.gi = mechanisms.index("gem") if self.has_ratio else -1
        self.mi = mechanisms.index("mgem") if self.has_ratio else -1
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.tmp = tmp
        self.pipes = None if pipelines is None else PipelineReducer(pipelines, mechanisms, epsilons)

    def _write(self, name: str, df: pl.DataFrame) -> None:
        if self.tmp is None:
            return
        table = df.to_arrow()
        if name not in self.writers:
            self.writers[name] = pq.ParquetWriter(self.tmp / f"{name}.parquet", table.schema)
        self.writers[name].write_table(table)

    def add(self, r: ChunkResult) -> None:
        B = len(r.user_ids)
        idx = np.arange(r.start, r.start + B)
        self.users += B
        self.exact |= r.exact
        self.mse.add(r.mse)
        if self.pipes is not None and r.pipelines is not None:
            self.pipes.add(r.pipelines)
        for key, vals, hist in (("spearman", r.spearman, self.h_s), ("weighted", r.weighted, self.h_w)):
            ok = np.isfinite(vals)
            self.undefined[key] += int((~ok).sum())
            self.pos[key] += int((vals[ok] > 0).sum())
            hist += np.histogram(vals[ok], bins=self.edges)[0]
        self.corr_mean.add(np.stack([r.spearman, r.weighted], axis=1))
        lr = None
        if self.has_ratio:
            lr = metrics.log_ratio(r.mean_selected[:, self.mi, :], r.mean_selected[:, self.gi, :])  # (B, E)
            self.ratio.add(lr)
            self.ratio_undefined += (~np.isfinite(lr)).sum(axis=0)
        users = pl.DataFrame(
            {
                "user_index": idx,
                "user_id": r.user_ids.astype(str),
                "n_candidates": r.count.astype(np.int64),
                "spearman": r.spearman,
                "weighted_correlation": r.weighted,
            }
        )
        self._write("users", users)
        M, E = len(self.mechanisms), len(self.epsilons)
        self._write(
            "selections",
            pl.DataFrame(
                {
                    "user_index": np.repeat(idx, M * E),
                    "mechanism": np.tile(np.repeat(np.array(self.mechanisms), E), B),
                    "epsilon": np.tile(np.array(self.epsilons, dtype=np.float64), B * M),
                    "mse": r.mse.reshape(-1),
                    "mean_selected": r.mean_selected.reshape(-1),
                }
            ),
        )
        if lr is not None:
            self._write(
                "log_ratio",
                pl.DataFrame(
                    {
                        "user_index": np.repeat(idx, E),
                        "epsilon": np.tile(np.array(self.epsilons, dtype=np.float64), B),
                        "log_ratio_mgem_gem": lr.reshape(-1),
                    }
                ),
            )
        keep = np.isin(idx, self.scatter_pick)
        if keep.any():
            self.scatter.append(
                pl.DataFrame(
                    {
                        "user_index": idx[keep],
                        "spearman": r.spearman[keep],
                        "weighted_correlation": r.weighted[keep],
                        "log_ratio": lr[keep, self.ratio_eps_idx]
                        if lr is not None
                        else np.full(int(keep.sum()), np.nan),
                    }
                )
            )

    def close(self) -> None:
        for acc in (self.mse, self.ratio, self.corr_mean):
            acc.flush()
        if self.pipes is not None:
            self.pipes.close()
        for w in self.writers.values():
            w.close()


def _notes(cfg: EvalConfig, mechanisms: tuple[str, ...], exact: np.ndarray) -> list[str]:
    """Caveats the reader must see: Monte Carlo fallbacks under --exact, non-DP reference mechanisms."""
    notes = []
    if cfg.exact:
        mc = [m for mi, m in enumerate(mechanisms) if not exact[mi] and m in MECHANISMS]  # auto: its choices
        if mc:
            notes.append(
                f"--exact: no exact probabilities for {', '.join(mc)}; used Monte Carlo with "
                f"{cfg.trials} trials for them"
            )
    notes += [
        f"{m} is NOT differentially private (paper §IV-A); shown for reference only"
        for m in mechanisms
        if m in MECHANISMS and not MECHANISMS[m].private
    ]
    return notes


def finish(cfg: EvalConfig, dataset: str, mechanisms: tuple[str, ...], red: Reducer, seconds: float) -> EvalResult:
    """The run's result from the closed reducer."""
    mean, half = red.mse.ci()
    E = len(red.epsilons)
    method = np.where(red.exact, "exact", "monte-carlo")
    columns = [np.repeat(np.array(mechanisms), E), np.tile(np.array(red.epsilons, dtype=np.float64), len(mechanisms))]
    columns += [x.reshape(-1) for x in (mean, mean - half, mean + half)]
    columns += [red.mse.n.reshape(-1).astype(np.int64), np.repeat(method, E)]
    mse = pl.DataFrame(columns, schema=MSE_SCHEMA, orient="col")
    rmean, rhalf = red.ratio.ci()
    columns = [np.array(red.epsilons, dtype=np.float64), rmean, rmean - rhalf, rmean + rhalf]
    columns += [red.ratio.n.astype(np.int64), red.ratio_undefined]
    log_ratio = pl.DataFrame(columns, schema=LOG_RATIO_SCHEMA, orient="col") if red.has_ratio else pl.DataFrame()
    cmean, _ = red.corr_mean.ci()
    n = max(red.users, 1)
    correlation = {"users": red.users} | {
        key: {"mean": float(cmean[i]), "frac_positive": red.pos[key] / n, "undefined": red.undefined[key]}
        for i, key in enumerate(("spearman", "weighted"))
    }
    scatter = pl.concat(red.scatter) if red.scatter else pl.DataFrame()
    return EvalResult(
        cfg,
        dataset,
        mechanisms,
        red.epsilons,
        red.users,
        mse,
        correlation,
        log_ratio,
        red.edges,
        red.h_s,
        red.h_w,
        scatter,
        red.epsilons[red.ratio_eps_idx],
        seconds,
        notes=_notes(cfg, mechanisms, red.exact),
        pipelines=None if red.pipes is None else red.pipes.table(),
    )
