"""`auto` in `recsvc eval`: a row resolved per ε from the artifact's policy table (or a
scenario's independent public population), its regret against the oracle, in every output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from eval.evaluation.config import EvalConfig
from eval.evaluation.run import run
from eval.testing import make_artifact
from recsvc.app.cli import main
from recsvc.artifact import ArtifactWriter, load_artifact
from recsvc.service.testing import add_policy

# k = 1: rnm at ε ≤ √(0.1·1) ≈ 0.316, krr above; k = 5 (ignored by the eval) says gem.
TABLE = [
    (0.1, 1, "rnm", 0.2, 1),
    (0.1, 1, "krr", 0.3, 2),
    (1.0, 1, "krr", 0.1, 1),
    (1.0, 1, "rnm", 0.2, 2),
    (10.0, 1, "krr", 0.01, 1),
    (10.0, 1, "rnm", 0.05, 2),
    (1.0, 5, "gem", 0.1, 1),
]
EPS = (0.1, 0.5, 5.0)
RESOLVED = {0.1: "rnm", 0.5: "krr", 5.0: "krr"}


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    return add_policy(make_artifact(tmp_path_factory.mktemp("ev") / "toy"), TABLE)


def _cfg(art: Path, **kw) -> EvalConfig:
    return EvalConfig(
        **{"artifacts": art, "epsilons": EPS, "trials": 8, "seed": 2, "workers": 1, "progress": False, **kw}
    )


def test_auto_is_a_row_resolved_per_epsilon_and_scored_against_the_oracle(art: Path, tmp_path: Path) -> None:
    res = run(_cfg(art, out=tmp_path / "r"))
    assert res.mechanisms[-1] == "auto" and len(res.mechanisms) == 12  # every private mechanism, then auto
    sel = pl.read_parquet(tmp_path / "r" / "selections.parquet")
    for eps, choice in RESOLVED.items():  # the resolved mechanism's own stream: identical per-user rows
        mine = sel.filter((pl.col("mechanism") == "auto") & (pl.col("epsilon") == eps)).sort("user_index")
        theirs = sel.filter((pl.col("mechanism") == choice) & (pl.col("epsilon") == eps)).sort("user_index")
        assert mine["mse"].to_list() == theirs["mse"].to_list() and mine.height == 12
    mse = {(r["mechanism"], r["epsilon"]): r["mse_mean"] for r in res.mse.iter_rows(named=True)}
    regret = res.auto.sort("epsilon")
    assert regret["auto_mechanism"].to_list() == [RESOLVED[e] for e in EPS]
    for r in regret.iter_rows(named=True):
        fixed = {m: v for (m, e), v in mse.items() if e == r["epsilon"] and m != "auto"}
        oracle = min(fixed, key=fixed.__getitem__)
        assert (r["oracle_mechanism"], r["oracle_mse"]) == (oracle, fixed[oracle])
        assert r["regret_ratio"] == pytest.approx(mse[("auto", r["epsilon"])] / fixed[oracle], rel=1e-12)
        assert r["regret_ratio"] >= 1.0
    assert all(m != "auto" for _, m, _ in res.winners())  # auto is scored against the fixed ones, not among them
    out = tmp_path / "r"
    assert pl.read_parquet(out / "auto_regret.parquet").equals(res.auto)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mechanisms"][-1] == "auto" and len(summary["auto"]["regret"]) == 3
    assert "policy.parquet" in summary["auto"]["origin"]
    report = (out / "report.md").read_text()
    assert "## `auto` against the oracle" in report and "| auto (policy table) (monte-carlo) |" in report
    assert "| 0.5 | krr |" in report


def test_auto_runs_its_choice_even_when_that_mechanism_is_not_in_the_run(art: Path) -> None:
    alone = run(_cfg(art, mechanisms=("em", "auto")))
    full = run(_cfg(art, mechanisms=("rnm", "krr", "em")))
    a = {(r["mechanism"], r["epsilon"]): r["mse_mean"] for r in alone.mse.iter_rows(named=True)}
    f = {(r["mechanism"], r["epsilon"]): r["mse_mean"] for r in full.mse.iter_rows(named=True)}
    assert [a[("auto", e)] for e in EPS] == [f[(RESOLVED[e], e)] for e in EPS]
    assert alone.auto["oracle_mechanism"].unique().to_list() == ["em"]  # the oracle is over the run's fixed ones
    without = run(_cfg(art, mechanisms=("rnm", "gem")))  # an explicit list without auto: as asked
    assert without.mechanisms == ("rnm", "gem") and without.auto.height == 0


def test_no_table_no_auto_row_and_naming_auto_is_a_clear_error(tmp_path: Path, snapshot, one_line_error) -> None:
    old = make_artifact(tmp_path / "old")
    res = run(_cfg(old))
    assert "auto" not in res.mechanisms and res.auto.height == 0
    assert any("has no policy.parquet: `auto` not evaluated" in n for n in res.notes)
    before = snapshot(tmp_path)
    assert main(["eval", "--artifacts", str(old), "--mechanisms", "rnm", "auto", "--out", str(tmp_path / "r")]) == 2
    one_line_error(r"has no policy.parquet, so `auto` cannot be evaluated; build it with `recsvc policy")
    assert snapshot(tmp_path) == before and not (tmp_path / "r").exists()


def test_scenario_auto_comes_from_an_independent_draw_of_its_population(tmp_path: Path) -> None:
    res = run(
        EvalConfig(
            scenario="2",
            mechanisms=("rnm", "gem", "mgem", "auto"),
            epsilons=(0.5, 2.0),
            trials=200,
            exact=True,
            workers=1,
            progress=False,
        )
    )
    # bimodal, negative correlation (high score ↔ small Δ): GEM is the scenario's best (paper Figure 2)
    assert res.auto["auto_mechanism"].to_list() == ["gem", "gem"]
    assert res.auto["regret_ratio"].to_list() == [1.0, 1.0]
    assert "independent draw of the scenario's population" in res.auto_origin
    plain = run(EvalConfig(scenario="2", mechanisms=None, epsilons=(1.0,), trials=5, workers=1, progress=False))
    assert "auto" not in plain.mechanisms  # scenarios: only when named (the table is computed at run time)
    assert np.isfinite(res.mse["mse_mean"].to_numpy()).all()


def test_a_table_built_on_the_test_users_is_flagged(tmp_path: Path) -> None:
    """`--sensitivity-population test` (the paper's mode) makes the table's population the test users."""
    art = make_artifact(tmp_path / "t")
    old = load_artifact(art).manifest
    content = {k: v for k, v in old.to_dict().items() if k not in ("files", "format_version")}
    with ArtifactWriter(art, force=True) as w:
        w.keep(art, list(old.files))
        w.commit({**content, "sensitivity_population": "test"})
    add_policy(art, TABLE)
    res = run(_cfg(art, mechanisms=("rnm", "auto")))
    assert "TEST users" in res.auto_origin
    assert any("computed on the test users themselves, so its regret here is optimistic" in n for n in res.notes)


def test_pipelines_cover_fixed_mechanisms_only(art: Path) -> None:
    from dataclasses import replace

    from eval.evaluation.auto import plan
    from eval.evaluation.sources import ArtifactSource

    cfg = replace(_cfg(art), pipelines=("top500",))
    source = ArtifactSource(art, None)
    assert plan(cfg, ("rnm", "gem"), source).mechanisms == ("rnm", "gem")  # the table is not used
    with pytest.raises(ValueError, match="`auto` is not evaluated with --pipelines"):
        plan(cfg, ("rnm", "auto"), source)


def test_auto_named_among_the_mechanisms_runs_beside_them(art: Path, tmp_path: Path) -> None:
    res = run(_cfg(art, mechanisms=("rnm", "auto"), out=tmp_path / "named"))
    assert res.mechanisms == ("rnm", "auto")
    mse = pl.read_csv(tmp_path / "named" / "mse.csv")
    assert sorted(set(mse["mechanism"])) == ["auto", "rnm"] and mse.height == 2 * len(EPS)
