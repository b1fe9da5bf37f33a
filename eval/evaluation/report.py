"""Markdown report and terminal summary of one evaluation run, and of a whole sweep (Figure 10)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from eval.evaluation import pipeline_report
from eval.evaluation.config import EvalConfig, param_values
from eval.evaluation.plots import CORRELATION_PNG, LOG_RATIO_PNG, MSE_PNG, SWEEP_PNG, mechanism_label

if TYPE_CHECKING:
    from eval.evaluation.results import EvalResult, SweepResult

SWEEP_TABLE_EPSILONS = 5  # the sweep report's table shows at most this many ε (all are in sweep.csv)


def _fmt(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.3g}"


def _with_ci(mean: float, low: float, high: float) -> str:
    """ "mean [low, high]"; the mean alone when there is no CI (one user)."""
    if np.isfinite(low) and np.isfinite(high):
        return f"{_fmt(mean)} [{_fmt(low)}, {_fmt(high)}]"
    return _fmt(mean)


def _param_text(cfg: EvalConfig) -> str:
    """``β=0.05, γ=0.008``: the values used (given or default; the report's settings line has
    always shown these two), then every other parameter that was given, e.g. ``alpha=0.25``."""
    values = param_values(cfg)
    shown = {"beta": "β", "gamma": "γ"}
    given = [f"{k}={values[k]}" for k, v in cfg.params.items() if v is not None and k not in shown]
    return ", ".join([f"{sym}={values[k]}" for k, sym in shown.items()] + given)


def mse_table(result: EvalResult) -> str:
    """Mechanisms as rows, ε as columns: mean MSE [95% CI]; the best per ε in bold."""
    best = {e: m for e, m, _ in result.winners()}
    head = "| mechanism | " + " | ".join(f"ε={e:g}" for e in result.epsilons) + " |"
    lines = [head, "|---" * (len(result.epsilons) + 1) + "|"]
    for mech in result.mechanisms:
        t = result.mse.filter(result.mse["mechanism"] == mech).sort("epsilon")
        cells = []
        for row in t.iter_rows(named=True):
            c = _with_ci(row["mse_mean"], row["ci_low"], row["ci_high"])
            cells.append(f"**{c}**" if best.get(row["epsilon"]) == mech else c)
        method = t["method"][0] if t.height else ""
        lines.append(f"| {mechanism_label(mech)} ({method}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def auto_section(result: EvalResult) -> list[str]:
    """`auto` (resolved per ε from the public policy table) against the oracle: the best fixed
    private mechanism chosen on these users themselves."""
    a = result.auto
    if not a.height:
        return []
    worst = a.sort("regret_ratio", descending=True).row(0, named=True)
    return [
        "## `auto` against the oracle",
        "",
        f"`auto` runs, at each ε, the mechanism chosen by {result.auto_origin}. The oracle is the best fixed "
        "private mechanism of this run at that ε, chosen on these users themselves (it could not be known in "
        f"advance). Worst regret: {worst['regret_ratio']:.3f}× at ε={worst['epsilon']:g}.",
        "",
        "| ε | auto → | auto MSE | oracle | oracle MSE | regret (× oracle) |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['epsilon']:g} | {r['auto_mechanism']} | {_fmt(r['auto_mse'])} | {r['oracle_mechanism']} | "
            f"{_fmt(r['oracle_mse'])} | {r['regret_ratio']:.3f} |"
            for r in a.iter_rows(named=True)
        ],
        "",
    ]


def winners_text(result: EvalResult) -> list[str]:
    notes = {True: "", False: " (CI overlaps the runner-up)", None: " (no CI: fewer than 2 users)"}
    return [f"ε={e:g}: {m}{notes[clear]}" for e, m, clear in result.winners()]


def markdown(result: EvalResult) -> str:
    """report.md of one run (its own layout, no settings table), the pipelines' section last."""
    c = result.correlation
    cfg = result.config
    lr = result.log_ratio
    parts = [
        f"# Evaluation: {result.dataset}",
        "",
        f"{result.users} users × {len(result.mechanisms)} mechanisms × {len(result.epsilons)} ε × "
        f"{cfg.trials} trials, seed {cfg.seed}, {_param_text(cfg)}"
        f"{', exact probabilities where available' if cfg.exact else ''}; {result.seconds:.1f} s.",
        "MSE is the mean over trials of (max q − q_selected)² on clipped scores, averaged over users "
        "(95% normal CI over users; none with a single user).",
        "",
        "## Which mechanism wins",
        "",
        *[f"- {w}" for w in winners_text(result)],
        "",
        "## MSE per mechanism and ε",
        "",
        mse_table(result),
        "",
        f"![MSE vs ε]({MSE_PNG})",
        "",
        *auto_section(result),
        "## Correlation of scores and sensitivities",
        "",
        f"- Spearman ρ(q, Δ): mean {_fmt(c['spearman']['mean'])}, "
        f"{c['spearman']['frac_positive']:.1%} of users positive, {c['spearman']['undefined']} undefined.",
        f"- Weighted correlation (Appendix I, B=5): mean {_fmt(c['weighted']['mean'])}, "
        f"{c['weighted']['frac_positive']:.1%} positive, {c['weighted']['undefined']} undefined.",
        "",
        f"![correlation histogram]({CORRELATION_PNG})",
        "",
    ]
    if lr.height:
        parts += [
            "## mGEM vs GEM per user",
            "",
            "log(mean selected score of mGEM / of GEM); > 0 means mGEM picks better items. Undefined "
            "(NaN) when either mean is ≤ 0.",
            "",
            "| ε | mean log-ratio [95% CI] | users defined | users undefined |",
            "|---|---|---|---|",
            *[
                f"| {r['epsilon']:g} | {_with_ci(r['mean_log_ratio'], r['ci_low'], r['ci_high'])} "
                f"| {r['users_defined']} | {r['users_undefined']} |"
                for r in lr.iter_rows(named=True)
            ],
            "",
            f"![log ratio vs correlation]({LOG_RATIO_PNG})",
            "",
        ]
    if result.notes:
        parts += ["## Notes", "", *[f"- {n}" for n in result.notes], ""]
    parts += [
        "Per-user tables: `users.parquet`, `selections.parquet`, `log_ratio.parquet`; "
        "aggregates: `mse.parquet`/`mse.csv`, `summary.json`.",
        "",
    ]
    return "\n".join(parts) + ("" if result.pipelines is None else pipeline_report.markdown(result))


def summary_text(result: EvalResult) -> str:
    c = result.correlation["spearman"]
    lines = [
        f"{result.dataset}: {result.users} users, {len(result.mechanisms)} mechanisms × {len(result.epsilons)} ε "
        f"in {result.seconds:.1f} s",
        f"Spearman ρ(q, Δ) > 0 for {c['frac_positive']:.1%} of users (mean {_fmt(c['mean'])})",
        "best mechanism (lowest mean MSE) per ε:",
        *[f"  {w}" for w in winners_text(result)],
        *result.notes,
    ]
    if result.auto.height:
        worst = result.auto.sort("regret_ratio", descending=True).row(0, named=True)
        lines.append(
            f"auto (policy table): worst regret {worst['regret_ratio']:.3f}× the oracle "
            f"(ε={worst['epsilon']:g}: {worst['auto_mechanism']} vs {worst['oracle_mechanism']})"
        )
    return "\n".join(lines)


def _sweep_settings(result: SweepResult) -> str:
    cfg, mechanisms, epsilons = result.config, result.mechanisms, result.epsilons
    how = "exact probabilities where available" if cfg.exact else f"{cfg.trials} trials (Monte Carlo)"
    grid = ", ".join(f"{e:g}" for e in epsilons)
    return (
        f"n = {cfg.n} candidates, {result.levels[0].result.users} user(s) per level, seed {cfg.seed}, "
        f"{_param_text(cfg)}, {how}; mechanisms {', '.join(mechanisms)}; ε ∈ {{{grid}}}"
    )


def summary_epsilon(epsilons: tuple[float, ...]) -> float:
    """ε = 1 when in the grid, else the middle of the sorted grid: the sweep's headline ε."""
    return 1.0 if 1.0 in epsilons else sorted(epsilons)[len(epsilons) // 2]


def _table_epsilons(epsilons: tuple[float, ...]) -> list[float]:
    """All ε when few, else evenly spread over the sorted grid with the headline ε swapped in."""
    grid = sorted(epsilons)
    if len(grid) <= SWEEP_TABLE_EPSILONS:
        return grid
    picked = {grid[i] for i in np.round(np.linspace(0, len(grid) - 1, SWEEP_TABLE_EPSILONS)).astype(int)}
    head = summary_epsilon(epsilons)
    if head not in picked:
        picked.remove(min(picked, key=lambda e: abs(np.log(e / head))))
        picked.add(head)
    return sorted(picked)


def sweep_markdown(result: SweepResult) -> str:
    """Settings, a level × ε table of the best mechanism (and its MSE ÷ RNM), the figure, links."""
    eps = _table_epsilons(result.epsilons)
    cell = "best mechanism and its MSE ÷ RNM's" if result.has_rnm else "best mechanism and its MSE (rnm not run)"
    head = "| t | median Spearman ρ | " + " | ".join(f"ε={e:g}" for e in eps) + " |"
    rows = [head, "|---" * (len(eps) + 2) + "|"]
    for lv, *best in zip(result.levels, *(result.best_at(e) for e in eps), strict=True):  # per level, per ε
        cells = [f"{m} {_fmt(rel)}" if result.has_rnm else f"{m} (MSE {_fmt(mse)})" for _, m, mse, rel in best]
        rows.append(f"| [{lv.level:g}]({lv.dirname}/report.md) | {lv.spearman:.3f} | " + " | ".join(cells) + " |")
    shown = (
        "" if len(eps) == len(result.epsilons) else f" ({len(eps)} of the {len(result.epsilons)} ε; all in `sweep.csv`)"
    )
    notes = result.levels[0].result.notes
    parts = [
        f"Each level t has {result.levels[0].result.users} independent instances (the synthetic users): score "
        "q_a = x_a, Δ_a = (t x_a + z_a)/5 − min_a, x, z ~ N(0, 1), from the same seed at every level. MSEs are "
        "means over the instances; ρ is the median over them.",
        "",
        f"{_sweep_settings(result)}; {result.seconds:.1f} s.",
        "",
        f"## Best mechanism per level and ε{shown}",
        "",
        f"Each cell: {cell} (< 1 beats RNM).",
        "",
        *rows,
        "",
        f"![sweep]({SWEEP_PNG})",
        "",
        "Top: the first instance's scores vs sensitivities. Bottom: each mechanism's mean MSE "
        + ("relative to RNM's (dashed line at 1)." if result.has_rnm else "(rnm not run: raw MSE, log scale)."),
        "",
    ]
    if notes:
        parts += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    parts += [
        "## Per level",
        "",
        *[f"- [t = {lv.level:g}]({lv.dirname}/report.md): `{lv.dirname}/`" for lv in result.levels],
        "",
        "Table: `sweep.csv`/`sweep.parquet` (level, spearman (median over instances), mechanism, epsilon, "
        "mse, mse_rel_rnm, method).",
        "",
    ]
    return "\n".join(parts)


def sweep_summary_text(result: SweepResult) -> str:
    e = summary_epsilon(result.epsilons)
    what = "MSE ÷ RNM" if result.has_rnm else "MSE"
    lines = [
        f"sweep: {len(result.levels)} levels × {len(result.mechanisms)} mechanisms × "
        f"{len(result.epsilons)} ε in {result.seconds:.1f} s; best mechanism at ε={e:g} ({what}):"
    ]
    for lv, mech, mse, rel in result.best_at(e):
        lines.append(f"  t={lv.level:<5g} ρ={lv.spearman:+.2f}  {mech} {_fmt(rel if result.has_rnm else mse)}")
    lines += result.levels[0].result.notes
    return "\n".join(lines)
