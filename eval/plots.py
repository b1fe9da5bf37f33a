"""Figure-13-style PNGs (matplotlib Agg): correlation histogram, mGEM/GEM log-ratio vs
correlation, and MSE vs ε per mechanism on log-log axes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from eval.harness import EvalResult

CORRELATION_PNG = "correlation_hist.png"
LOG_RATIO_PNG = "log_ratio_vs_correlation.png"
MSE_PNG = "mse_vs_epsilon.png"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def correlation_hist(result: EvalResult, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    edges = result.hist_edges
    width = np.diff(edges)
    ax.bar(edges[:-1], result.hist_spearman, width=width, align="edge", color="#4c72b0", alpha=0.75,
           edgecolor="white", label="Spearman ρ(q, Δ)")
    ax.step(edges, np.r_[result.hist_weighted, result.hist_weighted[-1:]], where="post", color="#dd8452",
            lw=1.8, label="weighted correlation (App. I, B=5)")
    ax.axvline(0, color="k", lw=0.8, ls="--")
    frac = result.correlation["spearman"]["frac_positive"]
    ax.set_title(f"{result.dataset}: per-user correlation of scores and Δ\n"
                 f"{result.users} users, {frac:.0%} with Spearman ρ > 0", fontsize=10)
    ax.set_xlabel("correlation")
    ax.set_ylabel("users")
    ax.set_xlim(-1, 1)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def log_ratio_scatter(result: EvalResult, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    s = result.scatter
    ok = np.zeros(0, dtype=bool)
    if s.height and "log_ratio" in s.columns:
        x, y = s["spearman"].to_numpy(), s["log_ratio"].to_numpy()
        ok = np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[ok], y[ok], s=6, alpha=0.5, color="#4c72b0", edgecolors="none")
    ax.axhline(0, color="k", lw=0.8, ls="--")
    skipped = int((~ok).sum()) if len(ok) else 0
    note = f"; {skipped} users with a mean selected score ≤ 0 left out" if skipped else ""
    if not result.log_ratio.height:
        note = "; needs both gem and mgem"
    ax.set_title(f"{result.dataset}: log(mean selected score mGEM / GEM) at ε = {result.ratio_epsilon:g}\n"
                 f"{int(ok.sum())} users shown{note}", fontsize=10)
    ax.set_xlabel("Spearman ρ(q, Δ)")
    ax.set_ylabel("log ratio  (> 0: mGEM better)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def mse_vs_epsilon(result: EvalResult, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.2, 4.5), dpi=110)
    markers = "osD^v<>pP*Xh"
    palette = plt.get_cmap("tab20").colors  # 11+ mechanisms: more distinct colours than the default 10
    for i, mech in enumerate(result.mechanisms):
        t = result.mse.filter(result.mse["mechanism"] == mech).sort("epsilon")
        e, m = t["epsilon"].to_numpy(), t["mse_mean"].to_numpy()
        lo, hi = t["ci_low"].to_numpy(), t["ci_high"].to_numpy()
        pos = m > 0  # log axes: a zero MSE cannot be drawn
        line, = ax.plot(e[pos], m[pos], marker=markers[i % len(markers)], ms=4, lw=1.4,
                        color=palette[(2 * i) % 20 + (i // 10) % 2],
                        label=mech + (" (not DP)" if mech == "rnmh" else ""),
                        ls="--" if mech in ("random", "rnmh") else "-")
        band = pos & np.isfinite(lo) & np.isfinite(hi)
        ax.fill_between(e[band], np.maximum(lo[band], m[band] * 1e-3), hi[band], color=line.get_color(), alpha=0.15)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("MSE  (max q − q_selected)²")
    ax.set_title(f"{result.dataset}: selection error, {result.users} users × {result.config.trials} trials "
                 f"(95% CI bands)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_all(result: EvalResult, out: Path) -> list[Path]:
    paths = [out / CORRELATION_PNG, out / LOG_RATIO_PNG, out / MSE_PNG]
    correlation_hist(result, paths[0])
    log_ratio_scatter(result, paths[1])
    mse_vs_epsilon(result, paths[2])
    return paths
