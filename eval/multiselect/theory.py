"""`recsvc eval-multiselect --theory`: the 1-D multi-selection theory as a table and two plots
(docs/concepts/multi-selection.md).

For each k and ε of the grid, ``theory.csv`` has the exact error f(ε, k) of the server's optimal
response to a Laplace signal (h(t) = t), a seeded Monte Carlo estimate of it, and the offsets.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from eval.study import publish
from recsvc.checks import ParamError, check_epsilon, check_int
from recsvc.multiselection import monte_carlo_error, optimal_response
from recsvc.rng import user_stream
from recsvc.settings import Range, check, setting
from recsvc.staging import check_out

DEFAULT_KS: tuple[int, ...] = (1, 2, 3, 5, 10, 20, 50)
DEFAULT_EPSILONS: tuple[float, ...] = (0.3, 0.5, 1.0, 2.0)
DEFAULT_MC_DRAWS = 100_000
THEORY_CSV = "theory.csv"
COLUMNS = ("k", "epsilon", "error", "mc_error", "offsets")


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
    figures: tuple[str, ...] = ()
    out: Path | None = None


def _distinct(param: str, values: Sequence[object]) -> None:
    if not values:
        raise ParamError(f"{{{param}}} is empty; give at least one value")
    if len(set(values)) != len(values):
        raise ParamError(f"{{{param}}} must be distinct, got {{values}}", values=" ".join(map(str, values)))


def check_grids(ks: Sequence[int], epsilons: Sequence[float]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The k and ε grids of either `eval-multiselect` mode as sorted tuples: integers k ≥ 1 and
    finite ε > 0, each distinct; a ParamError naming the flag otherwise."""
    ks = tuple(check_int("ks", k, 1) for k in ks)
    eps = tuple(check_epsilon(e, "{epsilons}", ParamError) for e in epsilons)
    _distinct("ks", ks)
    _distinct("epsilons", eps)
    return tuple(sorted(ks)), tuple(sorted(eps))


def validate(cfg: TheoryConfig) -> TheoryConfig:
    """Every check before any work (no output is created). Returns the grids as sorted tuples."""
    check(cfg)
    ks, epsilons = check_grids(cfg.ks, cfg.epsilons)
    seed = check_int("seed", cfg.seed, 0)
    if cfg.out is not None:
        check_out(cfg.out, cfg.force)
    return TheoryConfig(cfg.out, ks, epsilons, int(cfg.mc_draws), seed, cfg.force)


def theory_table(cfg: TheoryConfig) -> tuple[pl.DataFrame, float]:
    """One row per (k, ε), k slowest; and the largest Monte Carlo deviation in standard errors.
    Row i's draws come from ``user_stream(seed, i)``: reproducible, independent across rows."""
    rows: list[dict[str, object]] = []
    max_z = 0.0
    for k in cfg.ks:
        for eps in cfg.epsilons:
            response = optimal_response(eps, k)
            mean, se = monte_carlo_error(response.offsets, eps, cfg.mc_draws, user_stream(cfg.seed, len(rows)))
            max_z = max(max_z, abs(mean - response.error) / se)
            offsets = " ".join(f"{a:.15g}" for a in response.offsets)
            rows.append({"k": k, "epsilon": eps, "error": response.error, "mc_error": mean, "offsets": offsets})
    schema = {"k": pl.Int64, "epsilon": pl.Float64, "error": pl.Float64, "mc_error": pl.Float64, "offsets": pl.String}
    return pl.DataFrame(rows, schema=schema), max_z


def run_theory(cfg: TheoryConfig) -> TheoryResult:
    """Validates, computes the table, and writes ``theory.csv`` and the plots to ``cfg.out``
    atomically (a temp sibling renamed into place; nothing is left on failure)."""
    cfg = validate(cfg)
    t0 = time.perf_counter()
    table, max_z = theory_table(cfg)
    return publish(TheoryResult(cfg, table, max_z, time.perf_counter() - t0), _write)


def _write(result: TheoryResult, tmp: Path) -> None:
    from eval.multiselect import plots

    result.table.write_csv(tmp / THEORY_CSV)
    result.figures = plots.write_all(result.table, tmp)


def summary(result: TheoryResult) -> str:
    t = result.table
    scaled = (t["epsilon"] * t["k"] * t["error"]).to_numpy()
    largest = int(np.argmax(t["k"].to_numpy()))
    lines = [
        f"multi-selection theory: {t.height} (k, ε) rows in {result.seconds:.1f} s; Monte Carlo within "
        f"{result.max_z:.2f} standard errors of the exact error ({result.config.mc_draws:,} draws each)",
        f"ε·k·error at k = {int(t['k'][largest])}: {scaled[largest]:.4f} (the limit is 2)",
    ]
    if result.out is not None:
        lines.append(f"written: {result.out / THEORY_CSV}" + "".join(f", {f}" for f in result.figures))
    return "\n".join(lines)


def parse_offsets(text: str) -> list[float]:
    """The ``offsets`` column back as numbers."""
    return [float(x) for x in text.split()]
