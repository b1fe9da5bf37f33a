"""Figure 18 (Appendix E): the bimodal scenarios 1–3 as the proportion of high scores varies.

``recsvc eval-synthetic --scenario proportion``: scenario 1 (positive correlation), 2 (negative) and
3 (none) at every proportion in :data:`PROPORTIONS` (one fixed instance each, as in Figure 2) with
the usual harness; :data:`STUDY` declares its outputs (Figure 18 at ε = 2, or the grid's nearest ε)
and checks the paper's statements (:func:`findings`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from eval.evaluation import run as runner
from eval.evaluation.config import EvalConfig, param_values, validate
from eval.evaluation.plots import line_style, mechanism_label
from eval.evaluation.sources import ScenarioSource
from eval.figures import pyplot
from eval.study import Finding, Output, Study, execute
from recsvc.checks import ParamError
from recsvc.mechanisms.exact import random_stopping_two_candidates_lower

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PROPORTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
KINDS: dict[str, str] = {"1": "positive", "2": "negative", "3": "none"}  # Figure 18 (a), (b), (c)
FIGURE_EPSILON = 2.0
PROPORTION_CSV, PROPORTION_PARQUET, PROPORTION_PNG = "proportion.csv", "proportion.parquet", "proportion.png"
PROPORTION_SCHEMA = {"kind": pl.String, "correlation": pl.String, "proportion": pl.Float64, "mechanism": pl.String}
PROPORTION_SCHEMA |= {"epsilon": pl.Float64, "mse": pl.Float64, "method": pl.String}
_HETEROGENEOUS = ("gem", "mgem", "rs", "rs_improved", "rnmh")  # use the per-candidate Δ


def _source(kind: str, proportion: float, cfg: EvalConfig) -> ScenarioSource:
    return ScenarioSource(kind, cfg.n, cfg.users, cfg.seed, None, proportion)


@dataclass
class ProportionResult:
    config: EvalConfig
    table: pl.DataFrame  # kind, correlation, proportion, mechanism, epsilon, mse, method
    epsilon: float  # the ε of the figure and the findings
    seconds: float
    findings: list[Finding]
    out: Path | None = None


def check(cfg: EvalConfig) -> EvalConfig:
    """The study's checks, before any work: no --level, the flags and mechanisms, a bad --n."""
    if cfg.level is not None:
        raise ParamError(
            "{level} applies only to {scenario} sweep; {scenario} proportion runs the proportions "
            f"{', '.join(f'{p:g}' for p in PROPORTIONS)}"
        )
    validate(replace(cfg, scenario="1"))
    sources = [_source(k, p, cfg) for k in KINDS for p in PROPORTIONS]  # a bad --n fails here
    return runner.with_data_defaults(cfg, sources[0])


def compute(cfg: EvalConfig) -> ProportionResult:
    """Every kind × proportion with the same flags, and the paper's statements checked."""
    mechanisms = validate(replace(cfg, scenario="1", out=None))
    eps = min(cfg.epsilons, key=lambda e: abs(math.log(e / FIGURE_EPSILON)))
    t0 = time.perf_counter()
    frames = []
    for kind, p, source in ((k, p, _source(k, p, cfg)) for k in KINDS for p in PROPORTIONS):
        res = runner.evaluate(replace(cfg, scenario=kind, out=None, force=False), mechanisms, source)
        mse = res.mse.select("mechanism", "epsilon", pl.col("mse_mean").alias("mse"), "method")
        if cfg.exact:
            mse = _exact_random_stopping(mse, source.sc.scores, source.sc.sensitivities, param_values(cfg)["gamma"])
        frames.append(mse.with_columns(kind=pl.lit(kind), correlation=pl.lit(KINDS[kind]), proportion=pl.lit(p)))
    table = pl.concat(frames).select(*PROPORTION_SCHEMA)
    return ProportionResult(cfg, table, eps, time.perf_counter() - t0, findings(table, eps))


def _exact_random_stopping(mse: pl.DataFrame, q: np.ndarray, d: np.ndarray, gamma: float) -> pl.DataFrame:
    """rs / rs_improved exactly where every low candidate shares one Δ and every high one another
    (scenarios 1 and 2: two groups of tied candidates, :func:`random_stopping_two_candidates_lower`);
    scenario 3 mixes Δ inside each group and keeps its Monte Carlo estimate. MSE = 4·P(a low one)."""
    low, high = np.unique(d[q < 0]), np.unique(d[q > 0])
    if len(low) != 1 or len(high) != 1:
        return mse
    share, gap = float((q < 0).mean()), float(q.max() - q.min())
    rows = []
    for mech, eps, value, method in mse.iter_rows():
        if mech in ("rs", "rs_improved"):
            p_low = random_stopping_two_candidates_lower(gap, low[0], high[0], eps, gamma, mech, low_share=share)
            value, method = gap * gap * float(p_low), "exact"
        rows.append((mech, eps, value, method))
    return pl.DataFrame(rows, schema=mse.schema, orient="row")


def _mse(table: pl.DataFrame, kind: str, eps: float) -> dict[str, np.ndarray]:
    """Mechanism → MSE at each proportion (in PROPORTIONS order)."""
    t = table.filter((pl.col("kind") == kind) & (pl.col("epsilon") == eps)).sort("proportion")
    return {m: t.filter(pl.col("mechanism") == m)["mse"].to_numpy() for m in t["mechanism"].unique(maintain_order=True)}


def findings(table: pl.DataFrame, eps: float) -> list[Finding]:
    """Appendix E's statements about Figure 18, each over every proportion, for the mechanisms run."""
    out: list[Finding] = []
    pos, neg, none = (_mse(table, k, eps) for k in KINDS)
    props = np.array(sorted(set(table["proportion"].to_list())))
    homog = [m for m in ("rnm", "krr") if m in pos]
    if homog and "gem" in pos:
        rivals = np.min([pos[m] for m in [*homog, "gem"]], axis=0)
        for m in (m for m in ("rnmh", "mgem", "rs") if m in pos):
            wins = int((pos[m] < rivals).sum())
            out.append(
                Finding(
                    f"positive: {m} beats {', '.join(homog)} and gem for most proportions",
                    2 * wins > len(props),
                    f"at {wins} of {len(props)} proportions",
                )
            )
        best_het = np.min([pos[m] for m in ("rnmh", "mgem", "rs") if m in pos], axis=0)
        gap = np.min([pos[m] for m in homog], axis=0) - best_het
        peak = int(np.argmax(gap))
        out.append(
            Finding(
                "positive: the gap is smallest at the extremes and largest with a few high scores",
                0 < peak < len(props) - 1 and props[peak] <= 0.3 and gap[0] < gap[peak] > gap[-1],
                f"largest ({gap[peak]:.3g}) at proportion {props[peak]:g}; {gap[0]:.3g} at {props[0]:g}, "
                f"{gap[-1]:.3g} at {props[-1]:g}",
            )
        )
    if "rnm" in neg and "gem" in neg:
        helped = [m for m in _HETEROGENEOUS if m in neg and (neg[m] < neg["rnm"]).any()]
        out.append(
            Finding(
                "negative: heterogeneity helps only GEM (no other beats RNM at any proportion)",
                helped == ["gem"] and bool((neg["gem"] < neg["rnm"]).all()),
                f"beat RNM somewhere: {', '.join(helped) or 'none'}",
            )
        )
    if "random" in neg:
        for m in (m for m in ("rnmh", "mgem", "rs") if m in neg):
            worse = int((neg[m] > neg["random"]).sum())
            rel = float(np.max(np.abs(neg[m] / neg["random"] - 1)))
            out.append(
                Finding(
                    f"negative: {m} is worse than random at every proportion",
                    worse == len(props),
                    f"at {worse} of {len(props)}; largest relative difference from random {rel:.1%}",
                )
            )
    if "rnm" in none:
        het = [m for m in ("gem", "mgem", "rs", "rs_improved") if m in none]
        beat = {
            m: [f"{p:g}" for p, v, r in zip(props, none[m], none["rnm"], strict=True) if v < r * (1 - 1e-9)]
            for m in het
        }
        out.append(
            Finding(
                "none: heterogeneity does not help, RNM suffices (no heterogeneous DP mechanism beats it "
                "at any proportion)",
                not any(beat.values()),
                "; ".join(f"{m} beats RNM at {', '.join(v)}" for m, v in beat.items() if v)
                or f"{', '.join(het)} never beat RNM",
            )
        )
    return out


def figures(result: ProportionResult) -> dict[str, Figure]:
    """Figure 18: MSE vs the proportion of high scores at ε, one panel per correlation."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), dpi=110, sharey=True)
    mechs = result.table["mechanism"].unique(maintain_order=True).to_list()
    for ax, (kind, corr) in zip(axes, KINDS.items(), strict=True):
        t = result.table.filter((pl.col("kind") == kind) & (pl.col("epsilon") == result.epsilon))
        for i, m in enumerate(mechs):
            r = t.filter(pl.col("mechanism") == m).sort("proportion")
            ax.plot(r["proportion"], r["mse"], **line_style(plt, i, m), ms=3, lw=1.2, label=mechanism_label(m))
        ax.set_title(f"scenario {kind}: {'no' if corr == 'none' else corr} correlation", fontsize=10)
        ax.set_xlabel("proportion of high scores", fontsize=9)
        ax.grid(True, alpha=0.25)
    axes[0].set_ylabel(f"MSE at ε = {result.epsilon:g}", fontsize=9)
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    cfg = result.config
    fig.suptitle(
        f"Proportion of high scores (paper Fig. 18): n = {cfg.n}, "
        f"{'exact where available, else ' if cfg.exact else ''}{cfg.trials} trials",
        fontsize=10,
    )
    return {PROPORTION_PNG: fig}


TITLE = "Evaluation: proportion of high scores (paper Figure 18, Appendix E)"


def body(result: ProportionResult) -> str:
    cfg, eps = result.config, result.epsilon
    values = param_values(cfg)
    t = result.table.filter(pl.col("epsilon") == eps)
    mechs = t["mechanism"].unique(maintain_order=True).to_list()
    lines = [
        f"Scenarios 1 (positive), 2 (negative) and 3 (no correlation) with {len(PROPORTIONS)} proportions of high scores, "
        f"n = {cfg.n}, {cfg.trials} trials, β = {values['beta']}, γ = {values['gamma']}"
        f"{', exact probabilities where available (rs and rs_improved too in scenarios 1–2: two groups of tied candidates; Monte Carlo for rnmh, and for rs in scenario 3)' if cfg.exact else ''}; "
        f"{result.seconds:.1f} s. MSE = 4 × P(a low candidate is chosen). Findings and tables at ε = {eps:g}.",
        "",
        f"![Figure 18]({PROPORTION_PNG})",
        "",
        f"## The paper's statements ({sum(f.holds for f in result.findings)} of {len(result.findings)} hold)",
        "",
        "| statement | holds | measured |",
        "|---|---|---|",
        *[f"| {f.statement} | {'yes' if f.holds else '**no**'} | {f.detail} |" for f in result.findings],
    ]
    for kind, corr in KINDS.items():
        mse = _mse(result.table, kind, eps)
        lines += [
            "",
            f"## Scenario {kind} ({'no' if corr == 'none' else corr} correlation): MSE at ε = {eps:g}",
            "",
            "| proportion | " + " | ".join(mechanism_label(m) for m in mechs) + " |",
            "|---" * (len(mechs) + 1) + "|",
        ]
        for i, p in enumerate(PROPORTIONS):
            row = [mse[m][i] for m in mechs]
            best = min(v for m, v in zip(mechs, row, strict=True) if m != "rnmh")
            cells = (
                f"**{v:.3g}**" if v == best and m != "rnmh" else f"{v:.3g}" for m, v in zip(mechs, row, strict=True)
            )
            lines.append(f"| {p:g} | {' | '.join(cells)} |")
    lines += ["", f"All ε in `{PROPORTION_CSV}` / `{PROPORTION_PARQUET}`."]
    return "\n".join(lines) + "\n"


STUDY = Study(
    title=TITLE,
    config=EvalConfig,
    run=compute,
    outputs=tuple(Output(name, lambda r: r.table, PROPORTION_SCHEMA) for name in (PROPORTION_CSV, PROPORTION_PARQUET)),
    report=body,
    plots=figures,
    validate=check,
)


def run_proportion(cfg: EvalConfig) -> ProportionResult:
    """Every kind × proportion with the same flags, checked before any work, published atomically."""
    return execute(STUDY, cfg)
