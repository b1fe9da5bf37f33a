"""The seed's claims checked on the study's numbers, report.md's body and the terminal summary."""

from __future__ import annotations

import polars as pl

from eval.feature_selection import metrics, plots
from eval.feature_selection.config import FeatureSelectionConfig
from eval.feature_selection.methods import COUNT_SENSITIVITY, SIS_SENSITIVITY
from eval.feature_selection.study import DatasetRun, FeatureSelectionResult
from eval.study import Finding

COMPARISON_SCHEMA = {
    "dataset": pl.String,
    "k": pl.Int64,
    "epsilon": pl.Float64,
    "verdict": pl.String,
    "p_value": pl.Float64,
}


def comparisons(cfg: FeatureSelectionConfig, runs: list[DatasetRun]) -> pl.DataFrame:
    """Per (dataset, k, ε): which method is significantly more accurate (Welch, 5% per cell, no
    correction for the number of cells), or "tie", with the p-value."""
    words = {1: "dp-sis", -1: "two-stage", 0: "tie"}
    rows = []
    for r in runs:
        for i, k in enumerate(cfg.ks):
            for e, eps in enumerate(cfg.epsilons):
                sign, p = metrics.compare(r.private["dp-sis"][i, e], r.private["two-stage"][i, e])
                rows.append({"dataset": r.name, "k": k, "epsilon": eps, "verdict": words[sign], "p_value": p})
    return pl.DataFrame(rows, schema=COMPARISON_SCHEMA)


def findings(cfg: FeatureSelectionConfig, table: pl.DataFrame) -> list[Finding]:
    if table.is_empty():
        return []
    top = max(cfg.epsilons)
    at_top = table.filter(pl.col("epsilon") == top)
    wins = at_top.filter(pl.col("verdict") == "dp-sis")
    losses = table.filter(pl.col("verdict") == "two-stage")

    def cells(t: pl.DataFrame) -> str:
        cols = t.select("dataset", "k", "epsilon", "p_value").iter_rows()
        return "; ".join(f"{d} k={k} ε={e:g} (p = {p:.2g})" for d, k, e, p in cols) or "none"

    ties = at_top.filter(pl.col("verdict") != "dp-sis")
    return [
        Finding(
            f"DP-SIS is significantly more accurate than two-stage at the largest ε ({top:g})",
            wins.height == at_top.height,
            f"{wins.height} of {at_top.height} (dataset, k); not at: {cells(ties)}",
        ),
        Finding(
            "two-stage is never significantly more accurate than DP-SIS",
            losses.height == 0,
            f"two-stage significantly better in {losses.height} of {table.height} cells: {cells(losses)}",
        ),
    ]


def figure1_summary(table: pl.DataFrame) -> list[tuple[str, str, float, int]]:
    """Per (setting, method): the mean count of features 1–5 (w1's) and the largest of any other."""
    out = []
    for setting, method in table.select("setting", "method").unique(maintain_order=True).iter_rows():
        t = table.filter((pl.col("setting") == setting) & (pl.col("method") == method)).sort("feature")
        counts = t["count"].to_numpy()
        out.append((str(setting), str(method), float(counts[:5].mean()), int(counts[5:].max())))
    return out


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def accuracy_table(result: FeatureSelectionResult) -> str:
    """Markdown: rows (dataset, k, method), columns ε, cells "accuracy [low, high]"."""
    acc, cfg = result.accuracy, result.config
    assert acc is not None
    head = "| dataset | k | method | " + " | ".join(f"ε={e:g}" for e in cfg.epsilons) + " |"
    lines = [head, "|---" * (3 + len(cfg.epsilons)) + "|"]
    for name in cfg.datasets:
        for k in cfg.ks:
            for method in ("dp-sis", "two-stage"):
                t = acc.filter((pl.col("dataset") == name) & (pl.col("k") == k) & (pl.col("method") == method))
                cells = [
                    f"{_pct(a)} [{_pct(lo)}, {_pct(hi)}]"
                    for a, lo, hi in t.sort("epsilon").select("accuracy", "ci_low", "ci_high").iter_rows()
                ]
                lines.append(f"| {name} | {k} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TITLE = "Private feature selection: seed 004's study"


def body(result: FeatureSelectionResult) -> str:
    cfg = result.config
    out = [
        f"Neighbouring relation: {cfg.neighbouring} a row, so DP-SIS's scores |x_jᵀy| have Δ = "
        f"{SIS_SENSITIVITY[cfg.neighbouring]:g} and two-stage's block counts Δ = "
        f"{COUNT_SENSITIVITY[cfg.neighbouring]:g}. Both choose their k features with `{cfg.mechanism}` "
        f"({', '.join(f'{k} = {v:g}' for k, v in cfg.params.items()) or 'no parameters'}). The preprocessing (centring, scaling) uses the "
        "data's own statistics, treated as public bounds. Lasso λ = "
        f"{cfg.lasso_alpha:g}; seed {cfg.seed}; {result.seconds:.0f} s.",
        "",
    ]
    if result.figure1 is not None:
        out += [
            "## Figure 1 (non-private)",
            "",
            f"{cfg.repetitions:,} datasets per setting; how often features 1–5 (w1's) were among the five chosen:",
            "",
            "| setting | method | mean count of features 1–5 | largest count of any other |",
            "|---|---|---|---|",
        ]
        for setting, method, inside, outside in figure1_summary(result.figure1):
            out.append(f"| {setting} | {method} | {inside:.0f} | {outside} |")
        out += ["", f"![Figure 1]({plots.FIGURE1_PNG})", ""]
    if result.accuracy is not None and result.nonprivate is not None:
        out += ["## Accuracy against the non-private Lasso's top k", "", accuracy_table(result), ""]
        out += ["Non-private:", "", "| dataset | k | method | accuracy |", "|---|---|---|---|"]
        for name, method, k, a, lo, hi in result.nonprivate.iter_rows():
            out.append(f"| {name} | {k} | {method} | {_pct(a)} [{_pct(lo)}, {_pct(hi)}] |")
        out += ["", f"![accuracy]({plots.ACCURACY_PNG})", "", f"![TOP, GREAT, GOOD]({plots.RATES_PNG})", ""]
    if result.findings:
        out += ["## The seed's claims", ""]
        out += [f"- [{'yes' if f.holds else 'NO'}] {f.statement}: {f.detail}" for f in result.findings]
        out.append("")
    out += [f"- {n}" for n in result.notes]
    return "\n".join(out) + "\n"


def summary(result: FeatureSelectionResult) -> str:
    lines = [f"feature selection: {result.seconds:.1f} s"]
    if result.figure1 is not None:
        for setting, method, inside, _ in figure1_summary(result.figure1):
            reps = result.config.repetitions
            lines.append(f"  figure 1 {setting} {method}: features 1-5 chosen {inside:.0f} of {reps} times on average")
    held = sum(f.holds for f in result.findings)
    if result.findings:
        lines.append(f"{held} of {len(result.findings)} of the seed's claims hold")
        lines += [f"  [{'yes' if f.holds else 'NO '}] {f.statement}: {f.detail}" for f in result.findings]
    if result.out is not None:
        lines.append(f"report: {result.out / 'report.md'}")
    return "\n".join(lines)
