"""`auto` as a row of the evaluation: resolved per ε from the PUBLIC policy table,
scored on the run's users, and its regret against the oracle (the best fixed private mechanism
chosen on the run's users themselves).

- An artifact: its ``policy.parquet`` (built by ``recsvc prep``/``recsvc policy`` from the
  sensitivity population, never the test users). ``auto`` is a row by default when the artifact
  has a table; naming ``auto`` on an artifact without one is an error.
- A synthetic scenario (only when ``auto`` is named): a table computed here from the scenario's
  own population drawn independently (seed + 1, at most :data:`SCENARIO_POPULATION` rows), at the
  run's ε grid, with the run's mechanism parameters and ≥ :data:`SCENARIO_MC_SAMPLES` Monte Carlo
  selections per (mechanism, ε) in all.

At ε, ``auto`` runs the resolved mechanism with that mechanism's own stream and parameters, so
its row equals that mechanism's row wherever both are in the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from eval.evaluation.config import EvalConfig, mechanism_params
from eval.evaluation.sources import ArtifactSource, ScenarioSource, Source
from recsvc.artifact import CandidateMatrix
from recsvc.mechanisms import MECHANISMS
from recsvc.policy import AUTO, PolicySpec, PolicyTable, build_table

SCENARIO_POPULATION = 200  # rows of the scenario's independent public population
# Monte Carlo selections per (mechanism, ε) over the whole public population, at least: a scenario
# with one fixed row (1–3) would otherwise rank rs on a handful of draws.
SCENARIO_MC_SAMPLES = 20_000
# auto_regret.parquet / auto_regret.csv: one row per ε
REGRET_SCHEMA = {
    "epsilon": pl.Float64,
    "auto_mechanism": pl.String,
    "auto_mse": pl.Float64,
    "oracle_mechanism": pl.String,
    "oracle_mse": pl.Float64,
    "regret_ratio": pl.Float64,
    "regret": pl.Float64,
}


@dataclass(frozen=True)
class AutoPlan:
    """The run's mechanisms (``auto`` last, if in it), what ``auto`` resolves to at each ε, and
    where that came from (for the report)."""

    mechanisms: tuple[str, ...]
    resolved: Mapping[float, str] = field(default_factory=dict)  # ε → mechanism; empty without auto
    origin: str = ""  # "" without auto
    notes: tuple[str, ...] = ()


def scenario_matrix(sc) -> CandidateMatrix:
    """A scenario's rows as a population (what :mod:`recsvc.policy` averages over)."""
    rows, n = sc.repeats, sc.n
    shape = (rows, n)
    return CandidateMatrix(
        np.array([f"{sc.name}/{i}" for i in range(rows)]),
        np.broadcast_to(np.arange(n), shape),
        sc.draws,
        np.broadcast_to(sc.lo, shape),
        np.broadcast_to(sc.hi, shape),
        np.ascontiguousarray(np.broadcast_to(sc.sensitivities, shape)),
        np.full(rows, n),
    )


def _scenario_table(cfg: EvalConfig, source: ScenarioSource) -> PolicyTable:
    sc0 = source.sc
    sc = ScenarioSource(sc0.name, sc0.n, min(sc0.repeats, SCENARIO_POPULATION), cfg.seed + 1, sc0.level).sc
    rows = sc.repeats
    matrix = scenario_matrix(sc)
    trials = max(cfg.trials, -(-SCENARIO_MC_SAMPLES // rows))
    spec = PolicySpec(
        epsilons=tuple(float(e) for e in cfg.epsilons), ks=(1,), trials=trials, seed=cfg.seed + 1, users=rows
    )
    params = {k: v for m in spec.mechanisms for k, v in mechanism_params(cfg, m).items()}  # all auto may choose
    frame, _ = build_table(matrix, replace(spec, params=params), progress=cfg.progress)
    return PolicyTable.from_frame(frame, f"scenario {sc0.name} public population")


def plan(cfg: EvalConfig, mechanisms: tuple[str, ...], source: Source) -> AutoPlan:
    """Whether and how ``auto`` is a row of this run (see the module doc)."""
    named = AUTO in mechanisms
    fixed = tuple(m for m in mechanisms if m != AUTO)
    if cfg.pipelines:  # the pipelines' slate metrics cover fixed mechanisms only
        if named:
            raise ValueError(
                "`auto` is not evaluated with --pipelines; drop auto from --mechanisms or drop --pipelines"
            )
        return AutoPlan(fixed)
    notes: tuple[str, ...] = ()
    if isinstance(source, ArtifactSource):
        path, m = source.artifact.path, source.artifact.manifest
        if source.artifact.policy is None:
            if named:
                raise ValueError(
                    f"{path} has no policy.parquet, so `auto` cannot be evaluated; "
                    f"build it with `recsvc policy --artifacts {path}`"
                )
            note = f"{path} has no policy.parquet: `auto` not evaluated (build it with `recsvc policy`)"
            return AutoPlan(fixed, notes=(note,))
        if not named and cfg.mechanisms:  # an explicit list without auto: as asked
            return AutoPlan(fixed)
        table = PolicyTable.from_frame(source.artifact.policy, f"{path}/policy.parquet")
        users = f"{m.policy.users} " if m.policy is not None else ""
        kind = m.sensitivity_population or "population"
        if kind == "test":  # the paper's mode: the public population is the evaluated users themselves
            origin = f"the artifact's policy table (policy.parquet: expected MSE on {users}TEST users)"
            notes = (
                "the artifact was built with --sensitivity-population test: auto's table was computed on the "
                "test users themselves, so its regret here is optimistic",
            )
        else:
            origin = (
                f"the artifact's policy table (policy.parquet: expected MSE on {users}{kind} users, "
                "never the test users)"
            )
    elif not named:
        return AutoPlan(fixed)
    else:
        table = _scenario_table(cfg, source)
        origin = (
            f"a policy table from an independent draw of the scenario's population (seed {cfg.seed + 1}, "
            f"≤ {SCENARIO_POPULATION} rows)"
        )
    resolved = {float(e): table.resolve(float(e), 1) for e in cfg.epsilons}
    return AutoPlan((*fixed, AUTO), resolved, origin, notes)


def regret_table(mse: pl.DataFrame, resolved: Mapping[float, str]) -> pl.DataFrame:
    """Per ε: auto's choice and mean MSE, the oracle (the run's best fixed private mechanism on
    these users) and auto's regret (ratio and difference). Empty without auto."""
    if not resolved:
        return pl.DataFrame()
    rows = []
    for eps, choice in sorted(resolved.items()):
        at = mse.filter(pl.col("epsilon") == eps)
        fixed = at.filter(pl.col("mechanism").is_in([m for m, o in MECHANISMS.items() if o.private]))
        best = fixed.sort("mse_mean", maintain_order=True).row(0, named=True)
        mine = at.filter(pl.col("mechanism") == AUTO).row(0, named=True)["mse_mean"]
        ratio = mine / best["mse_mean"] if best["mse_mean"] > 0 else (1.0 if mine == 0 else float("inf"))
        rows.append((eps, choice, mine, best["mechanism"], best["mse_mean"], ratio, mine - best["mse_mean"]))
    return pl.DataFrame(rows, orient="row", schema=REGRET_SCHEMA)
