"""`recsvc eval-feature-selection`: its CSV schemas and values, one directory published at once,
and bad input refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from eval.feature_selection import config, data, methods, study
from eval.feature_selection.config import FeatureSelectionConfig
from eval.feature_selection.run import run
from recsvc.app.cli import main as recsvc_main

QUICK = ["--repetitions", "30", "--trials", "6", "--datasets", "diabetes", "--ks", "2", "5", "--epsilons", "1", "1e4"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fs") / "results"
    assert recsvc_main(["eval-feature-selection", "--out", str(out), *QUICK]) == 0
    return out


def test_outputs_and_their_schemas(results: Path) -> None:
    assert sorted(p.name for p in results.iterdir()) == [
        "accuracy.csv",
        "accuracy.png",
        "comparisons.csv",
        "figure1.csv",
        "figure1.png",
        "nonprivate.csv",
        "rates.csv",
        "rates.png",
        "report.md",
        "summary.json",
    ]
    assert not list(results.parent.glob(".results*"))  # the staging directory was renamed away
    fig1 = pl.read_csv(results / "figure1.csv")
    assert fig1.columns == ["setting", "method", "feature", "count"]
    acc = pl.read_csv(results / "accuracy.csv")
    assert acc.columns == ["dataset", "method", "k", "epsilon", "accuracy", "ci_low", "ci_high"]
    assert acc.height == 2 * 2 * 2  # methods × k × ε
    assert ((acc["ci_low"] <= acc["accuracy"]) & (acc["accuracy"] <= acc["ci_high"])).all()
    rates = pl.read_csv(results / "rates.csv")
    assert rates.columns == ["dataset", "k", "epsilon", "class", "rate", "ci_low", "ci_high"] and rates.height == 12
    summary = json.loads((results / "summary.json").read_text())
    assert summary["config"]["params"] == {"loss_weight": 0.5} and len(summary["findings"]) == 2


def test_figure1_counts(results: Path) -> None:
    fig1 = pl.read_csv(results / "figure1.csv")
    assert fig1.height == 2 * 2 * 100  # settings × methods × features
    per = fig1.group_by("setting", "method").agg(pl.col("count").sum())
    assert per["count"].to_list() == [30 * 5] * 4  # five features chosen per repetition
    sis_w1 = fig1.filter((pl.col("setting") == "W1") & (pl.col("method") == "sis")).sort("feature")["count"].to_numpy()
    assert sis_w1[:5].min() >= 25 and sis_w1[5:].max() <= 3
    # recomputed directly: repetition 0 of W1 chose these five, and each is counted
    rng = study.stream(0, 1, 0, 0)
    chosen = study.figure1_selections(data.figure1("W1", rng), 0.1, rng)["two-stage"]
    two = fig1.filter((pl.col("setting") == "W1") & (pl.col("method") == "two-stage")).sort("feature")["count"]
    assert two.to_numpy()[chosen].min() >= 1


def test_accuracy_values_match_a_direct_computation(results: Path) -> None:
    """At ε = 10⁴ DP-SIS is the non-private SIS: its accuracy is that of SIS's top k against the
    Lasso's top k, computed here from the data."""
    ds = data.diabetes()
    x, y = data.max_abs(ds.x, ds.y)
    xs, ys = data.standardised(ds.x, ds.y)
    acc = pl.read_csv(results / "accuracy.csv")
    for k in (2, 5):
        sis = np.argsort(-methods.sis_scores(x, y))[:k]
        ref = methods.lasso_reference(xs, ys, k, 0.1)
        want = len(set(sis.tolist()) & set(ref.tolist())) / k
        row = acc.filter((pl.col("method") == "dp-sis") & (pl.col("k") == k) & (pl.col("epsilon") == 1e4))
        assert row["accuracy"][0] == pytest.approx(want) and row["ci_low"][0] == pytest.approx(want)
    rates = pl.read_csv(results / "rates.csv").filter(pl.col("epsilon") == 1e4)
    assert rates["rate"].to_list() == [1.0] * 6


def test_cli_defaults_are_the_configs() -> None:
    cfg = FeatureSelectionConfig()
    assert (cfg.datasets, cfg.settings) == (data.DATASETS, data.SETTINGS)
    assert (cfg.trials, cfg.repetitions, cfg.mechanism) == (100, 1000, "clm")


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--ks", "0"], r"--ks must be an integer ≥ 1, got 0"),
        (["--ks", "11"], r"--ks = 11 is out of range for dataset diabetes; expected 1 ≤ k ≤ 10"),
        (["--epsilons", "0"], r"--epsilons must be a positive finite number, got 0\.0"),
        (["--epsilons", "1", "1"], r"--epsilons must be distinct"),
        (["--settings", "W3"], r"unknown --settings value 'W3'; expected some of W1, W1/W2"),
        (["--datasets", "iris"], r"unknown --datasets value 'iris'; expected some of fan-lv, diabetes"),
        (["--datasets", "--settings"], r"--datasets and --settings are both empty"),
        (["--trials", "0"], r"--trials must be an integer ≥ 1"),
        (["--lasso-alpha", "0"], r"--lasso-alpha must be a finite number > 0"),
        (["--loss-weight", "2"], r"--mechanism: .*loss_weight"),
        (["--mechanism", "rnmh"], r"--mechanism: .*NOT differentially private"),
    ],
)
def test_bad_input_is_refused_with_nothing_written(extra, match, tmp_path, snapshot, one_line_error) -> None:
    out = tmp_path / "res"
    (tmp_path / "keep.txt").write_text("x")
    before = snapshot(tmp_path)
    argv = ["eval-feature-selection", "--out", str(out), "--repetitions", "2", "--trials", "2", *QUICK[4:6], *extra]
    assert recsvc_main(argv) == 2
    one_line_error(match)
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_an_existing_out_needs_force(tmp_path, one_line_error) -> None:
    out = tmp_path / "res"
    out.mkdir()
    (out / "keep.txt").write_text("earlier")
    assert config.validate(FeatureSelectionConfig(out=None, settings=(), datasets=("diabetes",))).out is None
    assert recsvc_main(["eval-feature-selection", "--out", str(out), "--settings"]) == 2
    one_line_error(r"--out .*res already exists; pass --force to replace it")
    assert (out / "keep.txt").read_text() == "earlier"


def test_a_failing_run_leaves_nothing(tmp_path, monkeypatch) -> None:
    out = tmp_path / "res"

    def boom(*args: object) -> None:
        raise RuntimeError("plot failed")

    monkeypatch.setattr("eval.feature_selection.plots.figure1", boom)
    with pytest.raises(RuntimeError, match="plot failed"):
        run(FeatureSelectionConfig(out=out, datasets=(), repetitions=2, progress=False))
    assert list(tmp_path.iterdir()) == []


def test_a_datasets_numbers_do_not_depend_on_the_others_in_the_run(results: Path) -> None:
    """The module's run had both settings; W1/W2 alone gives the same counts."""
    alone = run(FeatureSelectionConfig(out=None, datasets=(), settings=("W1/W2",), repetitions=30, progress=False))
    assert alone.figure1 is not None
    both = pl.read_csv(results / "figure1.csv").filter(pl.col("setting") == "W1/W2")
    assert (
        alone.figure1.sort("method", "feature")["count"].to_list() == both.sort("method", "feature")["count"].to_list()
    )
