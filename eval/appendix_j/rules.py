"""Appendix J: GEM's utility bounds as heuristics for when GEM (or mGEM) does worse than a baseline.

GEM's guarantee (paper §IV-D, t = 2 ln(n/β)/ε): with probability 1 − β the chosen î satisfies
q_î ≥ q_j − Δ_î(t_GEM' − t) − Δ_j(t_GEM' + t) for every j, where t_GEM' = 2 ln(n/β)/ε. So

- GEM (t = +t'):  q_î ≥ q* − 4 ln(n/β) Δ*/ε, Δ* the best candidate's sensitivity. Worse than
  RNM's bound q* − 2 ln(n/β) Δmax/ε when Δ* > Δmax/2 (eq. 18), and worse than random
  selection's worst case q− when Δ* > (q* − q−)/(4 ln(n/β)/ε) (eq. 19);
- mGEM (t = −t'): q_î + 4 ln(n/β) Δ_î/ε ≥ q*, so its bound reaches the worst candidate when
  Δ− > (q* − q−)/(4 ln(n/β)/ε), Δ− the worst candidate's sensitivity (eq. 19 mirrored: our
  derivation, the paper states only GEM's).

:func:`predict` applies the rules; :func:`hit_rates` scores them against exact expected MSE on the
paper's scenarios; :data:`STUDY` declares them on :mod:`eval.study` (hit_rates.csv and report.md
with an ``out``). ``python -m eval.appendix_j.rules`` prints the table quoted in
docs/research/paper-reproduction.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from eval.study import Output, Study, execute
from recsvc.checks import check_epsilon
from recsvc.settings import Range, setting

RULES: dict[str, str] = {
    "gem_worse_than_random": "GEM worse than random (eq. 19)",
    "mgem_worse_than_random": "mGEM worse than random (eq. 19 mirrored)",
    "gem_worse_than_rnm": "GEM worse than RNM (eq. 18)",
}
SCENARIOS: tuple[str, ...] = ("1", "2", "4", "5")
DEFAULT_USERS = 200  # first rows of scenarios 4 and 5 (of 1000; 1 and 2 have one fixed instance)


@dataclass(frozen=True)
class AppendixJConfig:
    out: Path | None = setting(None, unit="dir", help="results directory")  # None: compute only, write nothing
    scenarios: tuple[str, ...] = setting(SCENARIOS, nargs="+", unit="name", help="the paper's scenarios")
    users: int = setting(DEFAULT_USERS, help="first users of each scenario", check=Range(1, integer=True))
    epsilons: tuple[float, ...] | None = None  # None: the main evaluation's
    beta: float = setting(0.05, help="GEM/mGEM β", check=Range(0, 1, low_open=True, high_open=True))
    force: bool = setting(False, help="replace an existing --out directory")


@dataclass
class AppendixJResult:
    config: AppendixJConfig
    table: pl.DataFrame
    out: Path | None = None


HIT_RATES_SCHEMA = (
    {"scenario": pl.String, "rule": pl.String}
    | dict.fromkeys(("cases", "predicted", "happened", "hits", "misses"), pl.Int64)
    | {"hit_rate": pl.Float64}
)


@dataclass(frozen=True)
class Prediction:
    """The events of :data:`RULES`, as :func:`predict` foresees them or as they happened."""

    gem_worse_than_random: bool
    mgem_worse_than_random: bool
    gem_worse_than_rnm: bool


def predict(scores: np.ndarray, sensitivities: np.ndarray, epsilon: float, beta: float = 0.05) -> Prediction:
    """The three rules on one (clipped) score vector. With tied best (worst) candidates Δ* (Δ−) is
    the one that gives the tightest (loosest) bound: the smallest Δ among the best, the largest
    among the worst."""
    q, d = np.asarray(scores, dtype=np.float64), np.asarray(sensitivities, dtype=np.float64)
    if q.ndim != 1 or q.shape != d.shape or q.size < 2:
        raise ValueError(f"expected scores and sensitivities of one shape (n,) with n ≥ 2, got {q.shape}, {d.shape}")
    check_epsilon(epsilon, "ε")
    if not 0 < beta < 1:
        raise ValueError(f"expected β in (0, 1), got β = {beta!r}")
    d_best = float(d[q == q.max()].min())
    d_worst = float(d[q == q.min()].max())
    reach = (q.max() - q.min()) / (4.0 * math.log(q.size / beta) / epsilon)
    return Prediction(bool(d_best > reach), bool(d_worst > reach), bool(d_best > d.max() / 2.0))


def _cases(name: str, users: int, epsilons: Sequence[float], beta: float) -> pl.DataFrame:
    """One row per user × ε: the rules' predictions and what happened (exact expected MSE of gem, mgem, rnm, random)."""
    from eval.scenarios import scenario
    from recsvc.mechanisms import probabilities

    sc = scenario(name)  # the default population, so Δ (its percentiles) is the scenario's own
    rows = []
    for b in range(min(users, sc.repeats)):
        q, d = sc.row(b)
        err = (q.max() - q) ** 2
        for eps in epsilons:
            mse = {
                m: float(probabilities(m, q, d, eps, **({"beta": beta} if "gem" in m else {})) @ err)
                for m in ("gem", "mgem", "rnm")
            }
            pred = {f"pred_{k}": v for k, v in asdict(predict(q, d, eps, beta)).items()}
            happened = Prediction(
                bool(mse["gem"] > err.mean()), bool(mse["mgem"] > err.mean()), bool(mse["gem"] > mse["rnm"])
            )
            rows.append({"scenario": name, "user": b, "epsilon": eps, **pred, **asdict(happened)})
    return pl.DataFrame(rows)


def hit_rates(
    scenarios: Sequence[str] = SCENARIOS,
    users: int = DEFAULT_USERS,
    epsilons: Sequence[float] | None = None,
    beta: float = 0.05,
) -> pl.DataFrame:
    """Per scenario and rule (and 'all' scenarios): cases (user × ε), how often the rule fires
    (``predicted``), how often the event happens, the hit rate (prediction = outcome) and the
    misses (it happened, the rule did not fire)."""
    from eval.evaluation.config import DEFAULT_EPSILONS

    cases = pl.concat([_cases(s, users, epsilons or DEFAULT_EPSILONS, beta) for s in scenarios])
    out = []
    for scope, t in [*((s, cases.filter(pl.col("scenario") == s)) for s in scenarios), ("all", cases)]:
        for rule in RULES:
            pred, actual = t[f"pred_{rule}"], t[rule]
            hits = int((pred == actual).sum())
            misses = int((actual & ~pred).sum())
            out.append((scope, rule, t.height, int(pred.sum()), int(actual.sum()), hits, misses, hits / t.height))
    return pl.DataFrame(out, schema=HIT_RATES_SCHEMA, orient="row")


def markdown(table: pl.DataFrame) -> str:
    """Rules as rows, scenarios as columns: hit rate (predicted / happened out of cases)."""
    scopes = table["scenario"].unique(maintain_order=True).to_list()
    lines = [
        "| rule | " + " | ".join(f"scenario {s}" if s != "all" else "all" for s in scopes) + " |",
        "|---" * (len(scopes) + 1) + "|",
    ]
    for rule, label in RULES.items():
        cells = []
        for s in scopes:
            r = table.filter((pl.col("scenario") == s) & (pl.col("rule") == rule)).row(0, named=True)
            cells.append(f"{100 * r['hit_rate']:.1f}% ({r['predicted']}/{r['happened']}/{r['misses']} of {r['cases']})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _compute(cfg: AppendixJConfig) -> AppendixJResult:
    return AppendixJResult(cfg, hit_rates(cfg.scenarios, cfg.users, cfg.epsilons, cfg.beta))


STUDY = Study(
    title="Appendix J: GEM's utility bounds as heuristics",
    config=AppendixJConfig,
    run=_compute,
    outputs=(Output("hit_rates.csv", lambda r: r.table, HIT_RATES_SCHEMA),),
    report=lambda r: f"{HEADING}\n\n{markdown(r.table)}",
)
HEADING = "Hit rate of the Appendix J rules against exact expected MSE (fired / happened / missed, of user × ε cases):"


if __name__ == "__main__":
    print(HEADING)
    print(markdown(execute(STUDY, AppendixJConfig()).table))
