"""Heatmaps of HG(M, M′) over Δ1 (x) × Δ2 (y), like the paper's Figures 3 and 15–17: red where
the mechanism beats the baseline (hg > 0), blue where the baseline wins, white at 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from eval.figures import pyplot
from eval.two_candidates.hg import TwoCandidateResult, figure_point, pair

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIG3_PNG, FIG15_PNG, FIG16_PNG, FIG17_PNG = "fig3.png", "fig15.png", "fig16.png", "fig17.png"
# (file, baseline, mechanism): the GEM family on the Figure 16/17 grid (§V-A, no figure in the paper)
GEM_FIGURES = (
    ("gem_vs_rnm.png", "rnm", "gem"),
    ("mgem_vs_rnm.png", "rnm", "mgem"),
    ("mgem_vs_gem.png", "gem", "mgem"),
    ("gem_vs_random.png", "random", "gem"),
    ("mgem_vs_random.png", "random", "mgem"),
)
_NAMES = {"rnm": "RNM", "rnmh": "RNMH", "rs": "RS_γ", "gem": "GEM", "mgem": "mGEM", "random": "random"}


def _label(base: str, mech: str, gamma: float | None) -> str:
    m = f"RS_{{γ={gamma:g}}}" if mech == "rs" else _NAMES[mech]
    return f"HG({_NAMES[base]}, {m})"


def _panel(ax, t: pl.DataFrame, deltas: tuple[float, ...], title: str):
    """One heatmap: t has one row per (Δ1, Δ2). Colour scale symmetric around 0 per panel."""
    k = len(deltas)
    pos = {d: i for i, d in enumerate(deltas)}
    z = np.full((k, k), np.nan)
    z[[pos[d] for d in t["delta2"]], [pos[d] for d in t["delta1"]]] = t["hg"].to_numpy()
    top = float(np.nanmax(np.abs(z))) or 1e-300
    mesh = ax.pcolormesh(deltas, deltas, z, cmap="RdBu_r", vmin=-top, vmax=top, shading="nearest")
    ax.plot([deltas[0], deltas[-1]], [deltas[0], deltas[-1]], color="k", lw=0.6, ls="--")
    ax.set_title(title, fontsize=8)
    ax.tick_params(labelsize=6)
    ax.set_aspect("equal")
    return mesh


def _figure(result: TwoCandidateResult, panels: list[tuple[pl.DataFrame, str]], ncols: int, title: str) -> Figure:
    plt = pyplot()
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols + 0.6, 2.5 * nrows + 0.7), dpi=110, squeeze=False)
    for ax in axes.ravel()[len(panels) :]:
        ax.set_visible(False)
    for ax, (t, sub) in zip(axes.ravel(), panels, strict=False):
        mesh = _panel(ax, t, result.config.deltas, sub)
        fig.colorbar(mesh, ax=ax, fraction=0.046, pad=0.03).ax.tick_params(labelsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("Δ1 (lower score)", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("Δ2 (higher score)", fontsize=7)
    fig.suptitle(title + "\nred: the second mechanism wins (hg > 0); blue: the first wins; dashed: Δ1 = Δ2", fontsize=9)
    return fig


def _select(t: pl.DataFrame, base: str, mech: str, eps: float, gap: float, gamma: float | None) -> pl.DataFrame:
    return pair(t, base, mech, gamma).filter((pl.col("epsilon") == eps) & (pl.col("gap") == gap))


def _grid_panels(result: TwoCandidateResult, base: str, mech: str, gamma: float | None) -> list:
    """Rows ε, columns gap (Figures 16 and 17)."""
    cfg = result.config
    return [
        (_select(result.table, base, mech, e, g, gamma), f"ε = {e:g}, q2 − q1 = {g:g}")
        for e in cfg.epsilons
        for g in cfg.gaps
    ]


def figures(result: TwoCandidateResult) -> dict[str, Figure]:
    """Figures 3, 15, 16, 17 at the grid points nearest the paper's, then the GEM family."""
    cfg, t = result.config, result.table
    eps, gap, gamma = figure_point(cfg)
    where, grid = f"ε = {eps:g}, q1 = 0, q2 = {gap:g}", "rows ε, columns q2 − q1"
    fig3 = [(_select(t, "rnm", m, eps, gap, g), _label("rnm", m, g)) for m, g in (("rnmh", None), ("rs", gamma))]
    fig15 = [(_select(t, "rnm", "rs", eps, gap, g), _label("rnm", "rs", g)) for g in cfg.gammas]
    specs = [
        (FIG3_PNG, fig3, 2, f"Figure 3: RNM vs RNMH and RS_γ, {where}"),
        (FIG15_PNG, fig15, min(len(cfg.gammas), 5), f"Figure 15: HG(RNM, RS_γ) as γ varies, {where}"),
        (FIG16_PNG, _grid_panels(result, "rnm", "rnmh", None), len(cfg.gaps), f"Figure 16: HG(RNM, RNMH); {grid}"),
        (
            FIG17_PNG,
            _grid_panels(result, "rnm", "rs", gamma),
            len(cfg.gaps),
            f"Figure 17: HG(RNM, RS_γ), γ = {gamma:g}; {grid}",
        ),
    ]
    specs += [
        (name, _grid_panels(result, b, m, None), len(cfg.gaps), f"{_label(b, m, None)} (β = {cfg.beta:g}); {grid}")
        for name, b, m in GEM_FIGURES
    ]
    return {name: _figure(result, panels, ncols, title) for name, panels, ncols, title in specs}
