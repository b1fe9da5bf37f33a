"""Figure 14(a)–(d) of the paper as PNGs (matplotlib Agg)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from eval.bandit.config import POLICIES, PRIVATE, BanditConfig
from eval.bandit.tables import NEVER_SWITCHING, BanditResult, ci
from eval.figures import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIG_A = "fig14a_cumulative_reward.png"
FIG_B = "fig14b_estimated_means.png"
FIG_C = "fig14c_quantiles_arm0.png"
FIG_D = "fig14d_quantiles_arm1.png"
COLORS = dict(zip(POLICIES, ("#000000", "#7f7f7f", "#8c564b", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"), strict=True))
LABELS = {
    "ucb": "UCB",
    "thompson": "TS",
    "krr": "kRR",
    "rnm": "RNM",
    "rs": "RS$_\\gamma$",
    "gem": "GEM",
    "mgem": "mGEM",
}


def figures(result: BanditResult) -> dict[str, Figure]:
    return {
        FIG_A: cumulative(result),
        FIG_B: estimated_means(result),
        FIG_C: estimated_quantiles(result, 0),
        FIG_D: estimated_quantiles(result, 1),
    }


def _shift_line(ax, result: BanditResult) -> None:
    ax.axvline(result.config.shift, color="k", lw=0.8, ls=":")


def _truth(ax, cfg: BanditConfig, before: float, after: float, **style) -> None:
    """A true value, dashed: ``before`` up to the shift, ``after`` from it."""
    ax.plot([1, cfg.shift, cfg.shift, cfg.horizon], [before, before, after, after], color="k", ls="--", **style)


def cumulative(result: BanditResult) -> Figure:
    """(a) mean cumulative reward over seeds with its 95% band; the never-switching UCB reading dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    cfg = result.config
    for policy in cfg.policies:
        d = result.curves.filter(pl.col("policy") == policy).sort(["t", "seed"])
        t = d["t"].unique(maintain_order=True).to_numpy()
        y = d["cumulative_reward"].to_numpy().reshape(t.size, -1)
        stats = np.array([ci(row) for row in y])
        ax.plot(t, stats[:, 0], color=COLORS[policy], lw=1.6, label=LABELS[policy])
        if y.shape[1] > 1:
            ax.fill_between(t, stats[:, 1], stats[:, 2], color=COLORS[policy], alpha=0.2, lw=0)
    greedy = [u for u in result.units if u.name == NEVER_SWITCHING]
    if greedy:
        t = result.curves["t"].unique(maintain_order=True).to_numpy()
        ax.plot(
            t,
            np.mean([u.cumulative for u in greedy], axis=0),
            color="k",
            lw=1.0,
            ls="--",
            label="UCB, no per-arm bonus (never switches)",
        )
    _shift_line(ax, result)
    ax.set_xlabel("t")
    ax.set_ylabel("cumulative reward")
    ax.set_title(
        f"(a) cumulative reward, mean and 95% CI over {cfg.seeds} seed(s); shift at t = {cfg.shift:,}", fontsize=10
    )
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def estimated_means(result: BanditResult) -> Figure:
    """(b) seed 0: each policy's mean reward per arm (lines) over the private scores it selects on (points)."""
    plt = pyplot()
    cfg = result.config
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110, sharey=True)
    d = result.means.filter(pl.col("seed") == 0)
    for arm, ax in enumerate(axes):
        for policy in cfg.policies:
            p = d.filter((pl.col("policy") == policy) & (pl.col("arm") == arm)).sort("t")
            t = p["t"].to_numpy()
            ax.plot(t, p["empirical_mean"].to_numpy(), color=COLORS[policy], lw=1.3, label=LABELS[policy])
            if policy in PRIVATE:
                ax.scatter(t[::4], p["private_mean"].to_numpy()[::4], color=COLORS[policy], s=4, alpha=0.5)
        _truth(ax, cfg, cfg.arms.expected(False)[arm], cfg.arms.expected(True)[arm], lw=0.8, label="true mean")
        _shift_line(ax, result)
        ax.set_title(f"(b) arm {arm}: estimated means (lines), private scores (points), seed 0", fontsize=9)
        ax.set_xlabel("t")
    axes[0].set_ylabel("mean reward")
    axes[0].legend(fontsize=7, ncol=2)
    return fig


def estimated_quantiles(result: BanditResult, arm: int) -> Figure:
    """(c)/(d) seed 0: the private p10/p90 estimates of one arm per window; true quantiles dashed."""
    plt = pyplot()
    cfg = result.config
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    d = result.quantiles.filter((pl.col("seed") == 0) & (pl.col("arm") == arm))
    for policy in cfg.policies:
        p = d.filter(pl.col("policy") == policy).sort("t")
        if p.height:
            for col, marker in (("p10", "v"), ("p90", "^")):
                ax.scatter(
                    p["t"], p[col], color=COLORS[policy], s=5, marker=marker, alpha=0.6, label=f"{LABELS[policy]} {col}"
                )
    for q in (0.1, 0.9):
        _truth(ax, cfg, cfg.arms.quantile(q, False)[arm], cfg.arms.quantile(q, True)[arm], lw=0.9)
    _shift_line(ax, result)
    ax.set_title(
        f"({'cd'[arm]}) arm {arm}: private 10th/90th percentiles per window of {cfg.window} "
        f"(seed 0); true values dashed",
        fontsize=9,
    )
    ax.set_xlabel("t (step at which the window filled)")
    ax.set_ylabel("reward quantile")
    ax.set_ylim(-0.02, 1.02)
    if d.height:  # an arm pulled fewer than w times has no window yet
        ax.legend(fontsize=6, ncol=3, markerscale=2)
    return fig
