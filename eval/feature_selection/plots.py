"""The study's PNGs: Figure 1's per-feature selection counts, accuracy against ε per dataset and
k (with the non-private methods as dashed lines), and DP-SIS's TOP / GREAT / GOOD rates."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from eval.figures import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from eval.feature_selection.study import FeatureSelectionResult

FIGURE1_PNG = "figure1.png"
ACCURACY_PNG = "accuracy.png"
RATES_PNG = "rates.png"
_COLOURS = {"sis": "C0", "dp-sis": "C0", "two-stage": "C1"}
_LABELS = {"sis": "SIS", "dp-sis": "DP-SIS", "two-stage": "two-stage"}


def figure1(table: pl.DataFrame, repetitions: int) -> Figure:
    """One panel per setting: how often each feature was chosen, SIS above the axis and two-stage
    below it, so the two bar series never hide each other."""
    plt = pyplot()
    settings = table["setting"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(settings), figsize=(5.2 * len(settings), 3.6), dpi=90, squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        for method, sign in (("sis", 1), ("two-stage", -1)):
            t = table.filter((pl.col("setting") == setting) & (pl.col("method") == method)).sort("feature")
            ax.bar(t["feature"], sign * t["count"].to_numpy(), width=1.0, color=_COLOURS[method], label=_LABELS[method])
        ax.axhline(0, color="k", lw=0.6)
        ax.set_ylim(-repetitions * 1.05, repetitions * 1.05)
        ticks = np.linspace(-repetitions, repetitions, 5)
        ax.set_yticks(ticks, [f"{abs(v):g}" for v in ticks])
        ax.set_xlabel("feature")
        ax.set_ylabel("times chosen (two-stage below the axis)")
        ax.set_title(f"{setting}: top 5 of {repetitions:,} datasets", fontsize=9)
        ax.legend(fontsize=8, loc="center right")
    return fig


def _share_grid(
    table: pl.DataFrame, ylabel: str, title: str, draw: Callable[[Any, pl.DataFrame, str, int], None]
) -> Figure:
    """One panel per dataset (row) and k (column) of shares in [0, 1] against ε on a log axis;
    ``draw(ax, panel's rows of table, dataset, k)`` fills a panel, the first one holds the legend."""
    datasets = table["dataset"].unique(maintain_order=True).to_list()
    ks = sorted(table["k"].unique().to_list())
    fig, axes = pyplot().subplots(
        len(datasets), len(ks), figsize=(4.2 * len(ks), 3.2 * len(datasets)), dpi=90, squeeze=False
    )
    for r, name in enumerate(datasets):
        for c, k in enumerate(ks):
            ax = axes[r][c]
            draw(ax, table.filter((pl.col("dataset") == name) & (pl.col("k") == k)), name, k)
            ax.set_xscale("log")
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("ε")
            ax.set_ylabel(ylabel)
            ax.set_title(title.format(name=name, k=k), fontsize=9)
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    return fig


def _band(ax: Any, t: pl.DataFrame, value: str, label: str, style: str, colour: str, alpha: float) -> None:
    """``value`` against ε with its confidence band (ci_low, ci_high)."""
    t = t.sort("epsilon")
    eps = t["epsilon"].to_numpy()
    ax.plot(eps, t[value], style, color=colour, label=label, ms=4)
    ax.fill_between(eps, t["ci_low"], t["ci_high"], color=colour, alpha=alpha, lw=0)


def accuracy(table: pl.DataFrame, nonprivate: pl.DataFrame) -> Figure:
    def draw(ax: Any, panel: pl.DataFrame, name: str, k: int) -> None:
        for method in ("dp-sis", "two-stage"):
            rows = panel.filter(pl.col("method") == method)
            _band(ax, rows, "accuracy", _LABELS[method], "o-", _COLOURS[method], 0.2)
        for method in ("sis", "two-stage"):
            row = nonprivate.filter((pl.col("dataset") == name) & (pl.col("k") == k) & (pl.col("method") == method))
            label = f"{_LABELS[method]}, not private"
            ax.axhline(float(row["accuracy"][0]), color=_COLOURS[method], ls="--", lw=1, label=label)

    return _share_grid(table, "accuracy vs the Lasso's top k", "{name}, k = {k}", draw)


def rates(table: pl.DataFrame) -> Figure:
    def draw(ax: Any, panel: pl.DataFrame, name: str, k: int) -> None:
        for i, cls in enumerate(("TOP", "GREAT", "GOOD")):
            _band(ax, panel.filter(pl.col("class") == cls), "rate", cls, "osD"[i] + "-", f"C{i + 2}", 0.15)

    return _share_grid(table, "share of DP-SIS's selections", "DP-SIS on {name}, k = {k}", draw)


def figures(result: FeatureSelectionResult) -> dict[str, Figure]:
    """Figure 1 when the run had its settings; accuracy and rates when it had datasets."""
    out = {}
    if result.figure1 is not None:
        out[FIGURE1_PNG] = figure1(result.figure1, result.config.repetitions)
    if result.accuracy is not None and result.nonprivate is not None and result.rates is not None:
        out[ACCURACY_PNG] = accuracy(result.accuracy, result.nonprivate)
        out[RATES_PNG] = rates(result.rates)
    return out
