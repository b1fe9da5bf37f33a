"""The two plots of `recsvc eval-multiselect --theory`: the optimal offsets on the noise density
in the setting of the source paper's Figure 2, and ε·k·error against k."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from eval.figures import pyplot
from recsvc.multiselection import identity_offsets, signal_log_density

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OFFSETS_PNG = "offsets.png"
SCALED_ERROR_PNG = "scaled_error.png"
FIGURE_K = 5  # the source paper's Figure 2
FIGURE_EPSILONS = (0.3, 0.5, 1.0)
_MARKERS = "osD^v<>p"


def offsets_figure() -> Figure:
    """Laplace densities ρ(t) for each ε, with the k = 5 optimal offsets as dots on them. Drawn
    for the paper's setting whatever the table's grid, so the figure is comparable."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=110)
    reach = 1.3 * float(identity_offsets(min(FIGURE_EPSILONS), FIGURE_K)[-1])
    t = np.linspace(-reach, reach, 801)
    for i, eps in enumerate(FIGURE_EPSILONS):
        (line,) = ax.plot(t, np.exp(signal_log_density(t, 0.0, eps)), lw=1.2, label=f"ε = {eps:g}")
        a = identity_offsets(eps, FIGURE_K)
        ax.plot(a, np.exp(signal_log_density(a, 0.0, eps)), _MARKERS[i], color=line.get_color(), ms=6)
    ax.set_xlabel("t (noise value; the dots are the offsets a₁ … a₅)")
    ax.set_ylabel("noise density ρ(t)")
    ax.set_title(f"Optimal server response, k = {FIGURE_K}, h(t) = t (Laplace noise of scale 1/ε)", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def scaled_error_figure(table: pl.DataFrame) -> Figure:
    """ε·k·f(ε, k) against k, exact (lines) and Monte Carlo (open markers), one series per ε, with
    the limit 2: the O(1/(εk)) rate. The exact curves coincide, since f scales as 1/ε."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=110)
    for i, (eps,) in enumerate(table.select("epsilon").unique(maintain_order=True).sort("epsilon").iter_rows()):
        t = table.filter(pl.col("epsilon") == eps).sort("k")
        k = t["k"].to_numpy()
        (line,) = ax.plot(k, eps * k * t["error"].to_numpy(), lw=1.0, label=f"ε = {eps:g}")
        ax.plot(k, eps * k * t["mc_error"].to_numpy(), _MARKERS[i % len(_MARKERS)], mfc="none", color=line.get_color())
    ax.axhline(2.0, color="k", ls="--", lw=0.8, label="limit 2")
    ax.set_xscale("log")
    ks = sorted(set(table["k"].to_list()))
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("k (results returned)")
    ax.set_ylabel("ε · k · error")
    ax.set_title("Error of the optimal k results, scaled by εk (lines exact, markers Monte Carlo)", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def theory_figures(table: pl.DataFrame) -> dict[str, Figure]:
    return {OFFSETS_PNG: offsets_figure(), SCALED_ERROR_PNG: scaled_error_figure(table)}


UTILITY_PNG = "utility_fraction.png"
HIT_RATE_PNG = "hit_rate.png"
_CENTRAL = {"recommend-auto": ("k", "s", "-"), "select-top500-auto": ("0.45", "^", "--")}
_PANELS = (
    ("multiselect-code", "code signal, posterior greedy"),
    ("multiselect", "lattice signal, posterior greedy"),
    ("multiselect-baseline", "multi-selection, top k for the signal"),
)


def measure_figure(table: pl.DataFrame, measure: str, label: str) -> Figure:
    """One row of panels per dataset, one panel per server response: the measure against ε with
    one line per k, the central modes at k = 1 (black: Recommend over the catalog; grey dashed:
    Select over the top 500, not end-to-end DP) and the non-private best item (dotted)."""
    plt = pyplot()
    datasets = table["dataset"].unique(maintain_order=True).to_list()
    n, right = len(datasets), _legend_right()
    fig, axes = plt.subplots(
        n, len(_PANELS), figsize=(14.5, 3.3 * n), dpi=80, squeeze=False, sharey="row", FigureClass=right
    )
    cmap = plt.get_cmap("viridis")
    for row, name in enumerate(datasets):
        t = table.filter((pl.col("dataset") == name) & pl.col("epsilon").is_finite() & (pl.col("epsilon") > 0))
        ks = sorted(set(t.filter(pl.col("mode") == "multiselect")["k"].to_list()))
        best = table.filter((pl.col("dataset") == name) & (pl.col("mode") == "nonprivate"))[measure]
        for col, (mode, title) in enumerate(_PANELS):
            ax = axes[row, col]
            for i, k in enumerate(ks):
                m = t.filter((pl.col("mode") == mode) & (pl.col("k") == k)).sort("epsilon")
                color = cmap(i / max(1, len(ks) - 1) * 0.9)
                _bars(ax, m, measure, color=color, marker="o", ms=3, label=f"k = {k}")
            for central, (color, marker, ls) in _CENTRAL.items():
                m = t.filter(pl.col("mode") == central).sort("epsilon")
                _bars(ax, m, measure, color=color, marker=marker, ms=4, ls=ls, label=central)
            if best.len():
                ax.axhline(float(best[0]), color="k", ls=":", lw=0.8, label="non-private best")
            ax.set_xscale("log")
            eps = sorted(set(t["epsilon"].to_list()))
            ax.set_xticks(eps, [f"{e:g}" for e in eps])
            ax.minorticks_off()
            ax.set_xlabel("ε")
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
        axes[row, 0].set_ylabel(label)
    handles, labels = axes[0, -1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center right")
    return fig


def _bars(ax: Any, m: pl.DataFrame, measure: str, **style: Any) -> None:
    ax.errorbar(m["epsilon"], m[measure], yerr=m[f"{measure}_ci"], lw=1.2, capsize=2, **style)


@cache
def _legend_right() -> type[Figure]:
    """A figure whose layout leaves its right 17% to the legend (save_figure's plain tight_layout() would not)."""
    from matplotlib.figure import Figure

    class LegendRight(Figure):
        def tight_layout(self, **kwargs: Any) -> None:
            super().tight_layout(**{**kwargs, "rect": (0, 0, 0.83, 1)})

    return LegendRight


def dataset_figures(table: pl.DataFrame) -> dict[str, Figure]:
    return {
        UTILITY_PNG: measure_figure(table, "utility_fraction", "fraction of optimal utility"),
        HIT_RATE_PNG: measure_figure(table, "hit_rate", "hit rate on held-out targets"),
    }
