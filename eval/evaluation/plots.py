"""Figure-13-style PNGs (matplotlib Agg): correlation histogram, mGEM/GEM log-ratio vs
correlation, and MSE vs ε per mechanism on log-log axes; and the Figure-10-style sweep figure."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eval.evaluation import pipeline_report
from eval.figures import pyplot
from recsvc.mechanisms import MECHANISMS
from recsvc.policy import AUTO

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from eval.evaluation.results import EvalResult, SweepResult

CORRELATION_PNG = "correlation_hist.png"
LOG_RATIO_PNG = "log_ratio_vs_correlation.png"
MSE_PNG = "mse_vs_epsilon.png"
SWEEP_PNG = "sweep.png"
_MARKERS = "osD^v<>pP*Xh"


def correlation_hist(result: EvalResult) -> Figure:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    edges = result.hist_edges
    ax.bar(
        edges[:-1],
        result.hist_spearman,
        width=np.diff(edges),
        align="edge",
        color="#4c72b0",
        alpha=0.75,
        edgecolor="white",
        label="Spearman ρ(q, Δ)",
    )
    ax.step(
        edges,
        np.r_[result.hist_weighted, result.hist_weighted[-1:]],
        where="post",
        color="#dd8452",
        lw=1.8,
        label="weighted correlation (App. I, B=5)",
    )
    ax.axvline(0, color="k", lw=0.8, ls="--")
    frac = result.correlation["spearman"]["frac_positive"]
    ax.set_title(
        f"{result.dataset}: per-user correlation of scores and Δ\n{result.users} users, {frac:.0%} with Spearman ρ > 0",
        fontsize=10,
    )
    ax.set_xlabel("correlation")
    ax.set_ylabel("users")
    ax.set_xlim(-1, 1)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def log_ratio_scatter(result: EvalResult) -> Figure:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    s = result.scatter
    ok = np.zeros(0, dtype=bool)
    if s.height and "log_ratio" in s.columns:
        x, y = s["spearman"].to_numpy(), s["log_ratio"].to_numpy()
        ok = np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[ok], y[ok], s=6, alpha=0.5, color="#4c72b0", edgecolors="none")
    ax.axhline(0, color="k", lw=0.8, ls="--")
    skipped = int((~ok).sum())
    note = f"; {skipped} users with a mean selected score ≤ 0 left out" if skipped else ""
    if not result.log_ratio.height:
        note = "; needs both gem and mgem"
    ax.set_title(
        f"{result.dataset}: log(mean selected score mGEM / GEM) at ε = {result.ratio_epsilon:g}\n"
        f"{int(ok.sum())} users shown{note}",
        fontsize=10,
    )
    ax.set_xlabel("Spearman ρ(q, Δ)")
    ax.set_ylabel("log ratio  (> 0: mGEM better)")
    return fig


def mechanism_label(mech: str) -> str:
    """The mechanism's name, marked when it is not DP, for legends and tables."""
    if mech == AUTO:
        return "auto (policy table)"
    return mech if MECHANISMS[mech].private else f"{mech} (not DP)"


def line_style(plt, i: int, mech: str) -> dict:
    """Mechanism i's marker, colour and line style, the same in every plot; references (the uniform
    baseline and mechanisms that are not DP) are dashed."""
    if mech == AUTO:  # drawn over its resolved mechanisms: black, dotted, hollow stars
        return {"marker": "*", "color": "k", "ls": ":", "mfc": "none", "zorder": 3}
    palette = plt.get_cmap("tab20").colors  # 11+ mechanisms: more distinct colours than the default 10
    reference = mech == "random" or not MECHANISMS[mech].private
    return {
        "marker": _MARKERS[i % len(_MARKERS)],
        "color": palette[(2 * i) % 20 + (i // 10) % 2],
        "ls": "--" if reference else "-",
    }


def mse_vs_epsilon(result: EvalResult) -> Figure:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.2, 4.5), dpi=110)
    drawn: list[float] = []
    for i, mech in enumerate(result.mechanisms):
        t = result.mse.filter(result.mse["mechanism"] == mech).sort("epsilon")
        e, m = t["epsilon"].to_numpy(), t["mse_mean"].to_numpy()
        lo, hi = t["ci_low"].to_numpy(), t["ci_high"].to_numpy()
        pos = m > 0  # log axes: a zero MSE cannot be drawn
        drawn += m[pos].tolist()
        (line,) = ax.plot(e[pos], m[pos], **line_style(plt, i, mech), ms=4, lw=1.4, label=mechanism_label(mech))
        band = pos & np.isfinite(lo) & np.isfinite(hi)
        low = np.maximum(lo[band], m[band] * 1e-3)
        drawn += low.tolist() + hi[band].tolist()
        ax.fill_between(e[band], low, hi[band], color=line.get_color(), alpha=0.15)
    _log_axes(ax, result.epsilons, drawn)
    ax.set_xlabel("ε")
    ax.set_ylabel("MSE  (max q − q_selected)²")
    ax.set_title(
        f"{result.dataset}: selection error, {result.users} users × {result.config.trials} trials (95% CI bands)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def figures(result: EvalResult) -> dict[str, Figure]:
    """File name → figure of one run (saved by :func:`eval.study.execute`); the pipelines' with --pipelines."""
    own = {
        CORRELATION_PNG: correlation_hist(result),
        LOG_RATIO_PNG: log_ratio_scatter(result),
        MSE_PNG: mse_vs_epsilon(result),
    }
    return own | ({} if result.pipelines is None else pipeline_report.figures(result.pipelines))


def _log_axes(ax, epsilons: tuple[float, ...], values: list[float]) -> None:
    """Log x over the ε grid and log y over the drawn (positive) values, with explicit limits:
    log autoscaling fails outright when nothing positive was drawn (e.g. every MSE is 0)."""
    ax.set_xscale("log")
    ax.set_xlim(min(epsilons) / 1.5, max(epsilons) * 1.5)
    if values:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 1.6, max(values) * 1.6)


def _plain_log_ticks(ax) -> None:
    """Decade ticks labelled 0.01, 0.1, 1 …; no minor labels (narrow ranges get crowded 6×10⁻¹ ones)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def sweep_figure(result: SweepResult, path: Path) -> None:
    """Figure 10: per level, the first instance's score vs Δ (top) and each mechanism's MSE ÷ RNM's vs ε
    (bottom, dashed line at 1: below it beats RNM); raw MSE on log-y when RNM was not run."""
    plt = pyplot()
    k = len(result.levels)
    fig, axes = plt.subplots(2, k, figsize=(2.5 * k + 1.6, 5.6), dpi=110, squeeze=False)
    rel = result.has_rnm
    col, ylabel = ("mse_rel_rnm", "MSE ÷ RNM's MSE") if rel else ("mse", "MSE (no rnm run: raw, log-y)")
    for j, lv in enumerate(result.levels):
        top, bottom = axes[0, j], axes[1, j]
        top.scatter(lv.scores, lv.sensitivities, s=7, alpha=0.6, color="#4c72b0", edgecolors="none")
        top.set_title(f"t = {lv.level:g}\nmedian Spearman ρ = {lv.spearman:.2f}", fontsize=9)
        top.set_xlabel("score q", fontsize=8)
        top.tick_params(labelsize=7)
        t = result.table.filter(result.table["level"] == lv.level)
        drawn, hidden = [1.0] if rel else [], 0
        for i, mech in enumerate(result.mechanisms):
            if rel and mech == "rnm":
                continue  # identically 1: the dashed line
            m = t.filter(t["mechanism"] == mech).sort("epsilon")
            e, y = m["epsilon"].to_numpy(), m[col].to_numpy()
            ok = np.isfinite(y) & (y > 0)  # log axes
            drawn += y[ok].tolist()
            hidden += int((~ok).sum())
            bottom.plot(e[ok], y[ok], **line_style(plt, i, mech), ms=3, lw=1.2, label=mechanism_label(mech))
        if rel:
            bottom.axhline(1.0, color="k", lw=1.0, ls="--", label="rnm (= 1)")
        _log_axes(bottom, result.epsilons, drawn)
        if hidden:
            bottom.text(
                0.02,
                0.02,
                f"{hidden} value(s) 0 or undefined: not drawn",
                transform=bottom.transAxes,
                fontsize=6,
                color="0.35",
            )
        _plain_log_ticks(bottom)
        bottom.set_xlabel("ε", fontsize=8)
        bottom.grid(True, which="major", alpha=0.25)
        bottom.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("sensitivity Δ", fontsize=8)
    axes[1, 0].set_ylabel(ylabel, fontsize=8)
    handles, labels = axes[1, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right", borderaxespad=0.3)
    cfg = result.config
    fig.suptitle(
        f"Correlation sweep (paper Fig. 10): n = {cfg.n}, seed {cfg.seed}, "
        f"{'exact probabilities where available' if cfg.exact else f'{cfg.trials} trials'}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1 - 1.5 / (2.5 * k + 1.6), 1))
    fig.savefig(path)
    plt.close(fig)
