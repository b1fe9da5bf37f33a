"""Aggregates, tables, plots and the report section of the candidate pipelines (eval.evaluation.pipelines)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from eval.evaluation.pipelines import PipelineContext
from eval.metrics import RunningMean

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from eval.evaluation.results import EvalResult

TABLE = "pipelines"  # pipelines.csv / pipelines.parquet
WINNERS = "pipelines_winners.csv"
MSE_PNG = "pipelines_first_mse.png"
RECALL_PNG = "pipelines_recall.png"
MECH_MSE_PNG = "slates_first_mse.png"  # the mechanisms side by side, one panel per (pipeline, k)
MECH_RECALL_PNG = "slates_recall.png"
_F, _I, _S = pl.Float64, pl.Int64, pl.String
_WITH_CI = ("first_mse", "first_mse_ci_low", "first_mse_ci_high", "recall", "recall_ci_low", "recall_ci_high")
# pipelines.csv/.parquet: one row per pipeline × mechanism × ε × k; the winners: per pipeline × k × ε
TABLE_SCHEMA = {"pipeline": _S, "end_to_end_dp": pl.Boolean, "mechanism": _S, "epsilon": _F, "k": _I}
TABLE_SCHEMA |= {**dict.fromkeys(_WITH_CI, _F), "users": _I, "method": _S}
WINNERS_SCHEMA = {
    "pipeline": _S,
    "k": _I,
    "epsilon": _F,
    "best_recall": _S,
    "recall": _F,
    "best_first_mse": _S,
    "first_mse": _F,
}


class PipelineReducer:
    """Running means (fixed 64-user blocks, so chunking-independent) of first-item MSE and recall."""

    def __init__(self, ctx: PipelineContext, mechanisms: tuple[str, ...], epsilons: tuple[float, ...]) -> None:
        self.ctx, self.mechanisms, self.epsilons = ctx, mechanisms, epsilons
        shape = (len(ctx.pipelines), len(mechanisms), len(epsilons), len(ctx.slate_k))
        self.mse, self.recall = RunningMean(shape), RunningMean(shape)
        self.exact = np.ones(shape, dtype=bool)

    def add(self, r: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        mse, recall, exact = r
        self.mse.add(mse)
        self.recall.add(recall)
        self.exact &= exact.all(axis=0)

    def close(self) -> None:
        self.mse.flush()
        self.recall.flush()

    def table(self) -> pl.DataFrame:
        (mm, mh), (rm, rh) = self.mse.ci(), self.recall.ci()
        pipes = self.ctx.pipelines
        # one row per (pipeline, mechanism, ε, k) cell, in row-major order (the run's order)
        pi, mi, ei, ki = np.indices(mm.shape).reshape(4, -1)
        trials = [self.ctx.two_stage_trials if p.kind == "two-stage" else self.ctx.trials for p in pipes]
        monte_carlo = np.array([f"monte-carlo ({t} trials)" for t in trials])
        columns = [np.array([p.label for p in pipes])[pi], np.array([p.end_to_end_dp for p in pipes])[pi]]
        columns += [np.array(self.mechanisms)[mi], np.array(self.epsilons, dtype=np.float64)[ei]]
        columns += [np.array(self.ctx.slate_k, dtype=np.int64)[ki]]
        columns += [x.reshape(-1) for x in (mm, mm - mh, mm + mh, rm, rm - rh, rm + rh)]
        columns += [self.mse.n.reshape(-1).astype(np.int64), np.where(self.exact.reshape(-1), "exact", monte_carlo[pi])]
        return pl.DataFrame(columns, orient="col", schema=TABLE_SCHEMA)


def winners(t: pl.DataFrame) -> pl.DataFrame:
    """Per (pipeline, k, ε): the mechanism with the highest recall and the one with the lowest
    first-item MSE (ties: the first in the run's order), with their values."""
    keys = ["pipeline", "k", "epsilon"]

    def best(column: str, highest: bool) -> pl.DataFrame:
        ranked = t.sort([*keys, column], descending=[False, False, False, highest], maintain_order=True)
        first = ranked.group_by(keys, maintain_order=True).first()
        return first.select(*keys, pl.col("mechanism").alias(f"best_{column}"), pl.col(column))

    return best("recall", True).join(best("first_mse", False), on=keys).sort(keys, maintain_order=True)


def _figure(
    t: pl.DataFrame, column: str, ylabel: str, log_y: bool, panel: str = "mechanism", line: str = "pipeline"
) -> Figure:
    """One panel per (``panel`` value, k), one line per ``line`` value, across ε."""
    from eval.figures import pyplot

    plt = pyplot()
    rows = t[panel].unique(maintain_order=True).to_list()
    ks = t["k"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(len(rows), len(ks), figsize=(4.2 * len(ks), 3.2 * len(rows)), dpi=110, squeeze=False)
    for r, name in enumerate(rows):
        for c, k in enumerate(ks):
            ax = axes[r][c]
            for value in t[line].unique(maintain_order=True).to_list():
                s = t.filter((pl.col(panel) == name) & (pl.col("k") == k) & (pl.col(line) == value)).sort("epsilon")
                dp = bool(s["end_to_end_dp"][0])
                ax.errorbar(
                    s["epsilon"],
                    s[column],
                    yerr=[s[column] - s[column + "_ci_low"], s[column + "_ci_high"] - s[column]],
                    label=value + ("" if dp else " (not end-to-end DP)"),
                    linestyle="-" if dp else "--",
                    marker="o",
                    markersize=3,
                    capsize=2,
                )
            ax.set_xscale("log")
            if log_y:
                ax.set_yscale("symlog", linthresh=1e-4)
            ax.set_title(f"{name}, k = {k}", fontsize=9)
            ax.set_xlabel("ε")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return fig


def _cell(row: dict, column: str) -> str:
    return f"{row[column]:.4g} [{row[column + '_ci_low']:.3g}, {row[column + '_ci_high']:.3g}]"


def markdown(result: EvalResult) -> str:
    t = result.pipelines
    assert t is not None
    cfg = result.config
    lines = [
        "",
        "## Candidate pipelines and slates",
        "",
        f"Full-catalog clipped scores of each test user (from `test_inputs.parquet`, seen items included, as "
        f"Recommend scores them). m = {cfg.two_stage_m}; two-stage's candidate stage spends F·ε: rnm peeling, "
        "or one run of the mechanism after `two-stage:F:`. "
        "`first_mse` = mean (max q − q_first)² of the slate's first item; `recall` = share of the slate in the "
        "true top-k of the full catalog (ties at the k-th score count). A one-shot mechanism (oneshot, gumbel, "
        "clm) draws each slate in one run at ε (clm lists its set in random order); the others peel k "
        "selections with ε/k each. **top500 is NOT end-to-end DP** (a non-private pre-filter on the history's scores).",
        "",
        "| pipeline | mechanism | ε | k | first-item MSE [95% CI] | recall@k [95% CI] | method |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in t.iter_rows(named=True):
        label = row["pipeline"] + ("" if row["end_to_end_dp"] else " (not DP)")
        lines.append(
            f"| {label} | {row['mechanism']} | {row['epsilon']:g} | {row['k']} | {_cell(row, 'first_mse')} | "
            f"{_cell(row, 'recall')} | {row['method']} |"
        )
    lines += [
        "",
        f"Winners (`{WINNERS}`): per pipeline, k and ε, the mechanism with the highest recall and the one "
        "with the lowest first-item MSE (point estimates; check the intervals above before calling a tie).",
        "",
        "| pipeline | k | ε | best recall | recall | best first-item MSE | first-item MSE |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in winners(t).iter_rows(named=True):
        lines.append(
            f"| {row['pipeline']} | {row['k']} | {row['epsilon']:g} | {row['best_recall']} | {row['recall']:.4g} | "
            f"{row['best_first_mse']} | {row['first_mse']:.4g} |"
        )
    lines += [
        "",
        f"Plots: `{MSE_PNG}`, `{RECALL_PNG}` (per mechanism), `{MECH_MSE_PNG}`, `{MECH_RECALL_PNG}` (per pipeline).",
        "",
    ]
    return "\n".join(lines)


def figures(t: pl.DataFrame) -> dict[str, Figure]:
    """The pipelines' figures: per mechanism (one line per pipeline), then per pipeline."""
    by_pipe = {"panel": "pipeline", "line": "mechanism"}
    return {
        MSE_PNG: _figure(t, "first_mse", "first-item MSE", log_y=True),
        RECALL_PNG: _figure(t, "recall", "recall of true top-k", log_y=False),
        MECH_MSE_PNG: _figure(t, "first_mse", "first-item MSE", log_y=True, **by_pipe),
        MECH_RECALL_PNG: _figure(t, "recall", "recall of true top-k", log_y=False, **by_pipe),
    }
