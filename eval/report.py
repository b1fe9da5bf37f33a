"""Markdown report and terminal summary of one evaluation run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from eval.plots import CORRELATION_PNG, LOG_RATIO_PNG, MSE_PNG

if TYPE_CHECKING:
    from eval.harness import EvalResult


def _fmt(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.3g}"


def _with_ci(mean: float, low: float, high: float) -> str:
    """"mean [low, high]"; the mean alone when there is no CI (one user)."""
    if np.isfinite(low) and np.isfinite(high):
        return f"{_fmt(mean)} [{_fmt(low)}, {_fmt(high)}]"
    return _fmt(mean)


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
        lines.append(f"| {mech}{' (not DP)' if mech == 'rnmh' else ''} ({method}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def winners_text(result: EvalResult) -> list[str]:
    notes = {True: "", False: " (CI overlaps the runner-up)", None: " (no CI: fewer than 2 users)"}
    return [f"ε={e:g}: {m}{notes[clear]}" for e, m, clear in result.winners()]


def markdown(result: EvalResult) -> str:
    c = result.correlation
    cfg = result.config
    lr = result.log_ratio
    parts = [
        f"# Evaluation: {result.dataset}",
        "",
        f"{result.users} users × {len(result.mechanisms)} mechanisms × {len(result.epsilons)} ε × "
        f"{cfg.trials} trials, seed {cfg.seed}, β={cfg.beta}, γ={cfg.gamma}"
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
            *[f"| {r['epsilon']:g} | {_with_ci(r['mean_log_ratio'], r['ci_low'], r['ci_high'])} "
              f"| {r['users_defined']} | {r['users_undefined']} |" for r in lr.iter_rows(named=True)],
            "",
            f"![log ratio vs correlation]({LOG_RATIO_PNG})",
            "",
        ]
    if result.notes:
        parts += ["## Notes", "", *[f"- {n}" for n in result.notes], ""]
    parts += ["Per-user tables: `users.parquet`, `selections.parquet`, `log_ratio.parquet`; "
              "aggregates: `mse.parquet`/`mse.csv`, `summary.json`.", ""]
    return "\n".join(parts)


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
    if result.out is not None:
        lines.append(f"report: {result.out / 'report.md'}")
    return "\n".join(lines)
