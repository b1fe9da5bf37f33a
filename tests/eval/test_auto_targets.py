"""The `auto` targets: `auto` (chosen from PUBLIC data only) is within 5% of the best fixed private
mechanism chosen on the evaluated users themselves (the oracle), at every ε of the evaluation grid:
on the real ml-100k artifact (policy from the validation users, scored on the test users) and on
synthetic scenarios 1, 2, 4 and 5 (policy from an independent draw of the scenario's population).

Scores are expected MSEs (exact where a mechanism has a cheap exact expectation, Monte Carlo with
≥ 10,000 selections per mechanism and ε otherwise), so the comparison is not Monte Carlo noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eval.evaluation.auto import plan, scenario_matrix
from eval.evaluation.config import EvalConfig
from eval.evaluation.run import run, with_data_defaults
from eval.evaluation.sources import ScenarioSource
from recsvc.artifact import CandidateMatrix, load_artifact
from recsvc.engines import LocalEngine
from recsvc.policy import EVALUATION_EPSILONS, PolicySpec, PolicyTable, population_mse

TARGET = 1.05


def _regret(
    matrix: CandidateMatrix, resolve, trials: int, seed: int, gamma: float
) -> list[tuple[float, str, str, float]]:
    """(ε, auto's choice, the oracle, auto's expected MSE ÷ the oracle's) on ``matrix``'s users,
    with random stopping's γ as the table used (the data's paper γ). In this process: per-user streams
    make the MSEs the same with any number of workers, and a pool's start costs more than it saves here."""
    spec = PolicySpec(epsilons=EVALUATION_EPSILONS, ks=(1,), trials=trials, seed=seed, params={"gamma": gamma})
    inner, mse, _ = population_mse(matrix, spec, LocalEngine(1, progress=False))
    names = spec.mechanisms
    rows = []
    for ei, eps in enumerate(inner):
        choice, best = resolve(float(eps)), int(np.argmin(mse[:, ei]))
        mine, low = mse[names.index(choice), ei], mse[best, ei]
        rows.append((float(eps), choice, names[best], 1.0 if mine == low else mine / low))
    return rows


def _check(rows: list[tuple[float, str, str, float]]) -> None:
    shown = "\n".join(f"ε={e:g}: auto→{c}, oracle {o}, regret {r:.4f}" for e, c, o, r in rows)
    assert max(r for *_, r in rows) <= TARGET, shown


def test_ml100k_auto_is_within_5_percent_of_the_oracle_at_every_epsilon(ml100k: Path) -> None:
    art = load_artifact(ml100k)
    info = art.manifest.policy
    assert art.policy is not None and info is not None
    table = PolicyTable.from_frame(art.policy)
    assert info.users == 100  # the 100 validation users, never the test users
    assert dict(info.params) == {"gamma": 0.008}  # MovieLens: the paper's γ
    rows = _regret(art.candidate_matrix(), table.resolve, trials=100, seed=1, gamma=0.008)  # its own streams
    _check(rows)
    # What the issue measured: at ε = 8 the sign rule's mgem was 3.7× worse than krr; auto picks krr.
    assert [c for e, c, *_ in rows if e >= 8] == ["krr", "krr"]
    assert [c for e, c, *_ in rows if e <= 4] == ["mgem"] * 9
    # `recsvc eval` as the demo runs it (Monte Carlo, 50 trials): the reported regret meets it too. One
    # worker: results do not depend on the workers (test_same_seed_identical_across_chunking_processes_and_dask).
    res = run(EvalConfig(artifacts=ml100k, workers=1, progress=False))
    worst = res.auto["regret_ratio"].max()
    assert isinstance(worst, float) and worst <= TARGET, res.auto


@pytest.mark.parametrize("name, rows", [("1", 1), ("2", 1), ("4", 100), ("5", 100)])
def test_scenario_auto_is_within_5_percent_of_the_oracle_at_every_epsilon(name: str, rows: int) -> None:
    source = ScenarioSource(name, 100, rows, 0, None)
    cfg = with_data_defaults(
        EvalConfig(scenario=name, users=rows, mechanisms=("auto",), epsilons=EVALUATION_EPSILONS, seed=0), source
    )  # γ = 0.05, the paper's on synthetic data, as eval runs it
    gamma = cfg.params["gamma"]
    assert cfg.mechanisms is not None and gamma is not None
    auto = plan(cfg, cfg.mechanisms, source)  # the table of an independent draw (seed 1)
    _check(
        _regret(
            scenario_matrix(source.sc),
            auto.resolved.__getitem__,
            trials=max(100, 20_000 // rows),
            seed=0,
            gamma=gamma,
        )
    )
