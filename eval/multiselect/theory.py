"""`recsvc eval-multiselect --theory`: the 1-D multi-selection theory as a table and two plots
(docs/concepts/multi-selection.md).

For each k and ε of the grid, ``theory.csv`` has the exact error f(ε, k) of the server's optimal
response to a Laplace signal (h(t) = t), a seeded Monte Carlo estimate and the offsets (eval.study writes it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl

from eval.multiselect import plots
from eval.study import Output, Study, distinct, execute, grid_text
from recsvc.checks import ParamError, check_epsilon, check_int
from recsvc.multiselection import monte_carlo_error, optimal_response
from recsvc.rng import user_stream
from recsvc.settings import Range, setting

DEFAULT_KS: tuple[int, ...] = (1, 2, 3, 5, 10, 20, 50)
DEFAULT_EPSILONS: tuple[float, ...] = (0.3, 0.5, 1.0, 2.0)
DEFAULT_MC_DRAWS = 100_000
THEORY_CSV = "theory.csv"
SCHEMA = {"k": pl.Int64, "epsilon": pl.Float64, "error": pl.Float64, "mc_error": pl.Float64, "offsets": pl.String}


@dataclass(frozen=True)
class TheoryConfig:
    out: Path | None = None
    ks: Sequence[int] = DEFAULT_KS
    epsilons: Sequence[float] = DEFAULT_EPSILONS
    mc_draws: int = setting(
        DEFAULT_MC_DRAWS, help="--theory: Monte Carlo draws per (k, ε)", check=Range(2, integer=True)
    )
    seed: int = 0
    force: bool = False


@dataclass
class TheoryResult:
    config: TheoryConfig
    table: pl.DataFrame
    max_z: float  # the largest |mc_error − error| in standard errors
    seconds: float
    out: Path | None = None


def check_grids(ks: Sequence[int], epsilons: Sequence[float]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The k and ε grids of either `eval-multiselect` mode as sorted tuples: integers k ≥ 1 and
    finite ε > 0, each distinct; a ParamError naming the flag otherwise."""
    ks = tuple(check_int("ks", k, 1) for k in ks)
    eps = tuple(check_epsilon(e, "{epsilons}", ParamError) for e in epsilons)
    distinct("ks", ks, empty=False)
    distinct("epsilons", eps, empty=False)
    return tuple(sorted(ks)), tuple(sorted(eps))


def validate(cfg: TheoryConfig) -> TheoryConfig:
    """The grids' and the seed's checks (after the settings'). Returns the grids as sorted tuples."""
    ks, epsilons = check_grids(cfg.ks, cfg.epsilons)
    seed = check_int("seed", cfg.seed, 0)
    return TheoryConfig(cfg.out, ks, epsilons, int(cfg.mc_draws), seed, cfg.force)


def compute(cfg: TheoryConfig) -> TheoryResult:
    """One row per (k, ε), k slowest, and the largest Monte Carlo deviation in standard errors.
    Row i's draws come from ``user_stream(seed, i)``: reproducible, independent across rows."""
    t0 = time.perf_counter()
    rows: list[tuple[int, float, float, float, str]] = []
    max_z = 0.0
    for k in cfg.ks:
        for eps in cfg.epsilons:
            response = optimal_response(eps, k)
            mean, se = monte_carlo_error(response.offsets, eps, cfg.mc_draws, user_stream(cfg.seed, len(rows)))
            max_z = max(max_z, abs(mean - response.error) / se)
            rows.append((k, eps, response.error, mean, " ".join(f"{a:.15g}" for a in response.offsets)))
    return TheoryResult(cfg, pl.DataFrame(rows, schema=SCHEMA, orient="row"), max_z, time.perf_counter() - t0)


def findings(result: TheoryResult) -> list[str]:
    """How close the Monte Carlo estimate is, and ε·k·error at the largest k (the limit is 2)."""
    t = result.table
    scaled = (t["epsilon"] * t["k"] * t["error"]).to_numpy()
    largest = int(np.argmax(t["k"].to_numpy()))
    return [
        f"multi-selection theory: {t.height} (k, ε) rows in {result.seconds:.1f} s; Monte Carlo within "
        f"{result.max_z:.2f} standard errors of the exact error ({result.config.mc_draws:,} draws each)",
        f"ε·k·error at k = {int(t['k'][largest])}: {scaled[largest]:.4f} (the limit is 2)",
    ]


def body(result: TheoryResult) -> str:
    """report.md's body: the grids (not settings, so not in its table of settings) and the findings."""
    cfg = result.config
    grids = f"k ∈ {{{grid_text(cfg.ks)}}}, ε ∈ {{{grid_text(cfg.epsilons)}}}, seed {cfg.seed}"
    return "\n".join([f"`{THEORY_CSV}` for {grids}.", "", *(f"- {x}" for x in findings(result))])


STUDY = Study(
    title="Multi-selection theory",
    config=TheoryConfig,
    run=compute,
    outputs=(Output(THEORY_CSV, lambda r: r.table, SCHEMA),),
    report=body,
    plots=lambda r: plots.theory_figures(r.table),
    validate=validate,
)

run_theory = partial(execute, STUDY)


def summary(result: TheoryResult) -> str:
    lines = findings(result)
    if (o := result.out) is not None:
        lines.append(f"written: {o / THEORY_CSV}, {o / 'report.md'}, {plots.OFFSETS_PNG}, {plots.SCALED_ERROR_PNG}")
    return "\n".join(lines)


def parse_offsets(text: str) -> list[float]:
    """The ``offsets`` column back as numbers."""
    return [float(x) for x in text.split()]
