"""policy.parquet in the artifact: written by `recsvc prep`, rebuilt by `recsvc policy`
to the same bytes, atomically; bad input is a clear error that changes nothing; older artifacts
without a table stay readable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import data_prep.rebuild_policy as policy_cmd
from data_prep.pipeline import PrepConfig, run
from eval.testing import make_artifact
from recsvc.app.cli import main
from recsvc.artifact import POLICY, POPULATION, load_artifact
from recsvc.policy import (
    POLICY_EPSILONS,
    SLATE_SIZES,
    UTILITY,
    PolicyTable,
    policy_mechanisms,
    slate_policy_mechanisms,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("policy") / "art"
    return run(PrepConfig(dataset="synthetic", preset="tiny", out=out, workers=1, chunk_users=16, progress=False))


def _manifest(path: Path) -> dict:
    m = json.loads((path / "manifest.json").read_text())
    m.pop("timings_s")
    return m


def test_prep_writes_a_hashed_policy_table_of_the_population(tiny: Path) -> None:
    art = load_artifact(tiny)  # verifies the sha256 of policy.parquet and population.parquet too
    m = art.manifest
    assert {POLICY, POPULATION} <= set(m.files)
    info = m.policy
    assert info is not None and m.timings_s is not None
    assert info.epsilons == POLICY_EPSILONS and info.ks == SLATE_SIZES and info.mechanisms == policy_mechanisms()
    # rs/rs_improved with the γ the paper used on synthetic data (the manifest's default_gamma)
    assert (info.users, info.trials, info.seed, dict(info.params), info.utility) == (
        60,
        50,
        42,
        {"gamma": 0.05},
        UTILITY,
    )
    assert m.default_gamma == 0.05 and info.candidates == int(art.population_matrix().count.max()) <= 150
    assert m.timings_s["policy"] > 0
    pop = art.population_matrix()  # the 60 validation users: the sensitivity population
    assert len(pop.user_ids) == 60 and not set(pop.user_ids) & set(art.user_ids)
    assert (pop.count == pop.count.max()).sum() > 0 and pop.count.max() <= 150
    table = art.policy
    assert table is not None
    slates = sum(k > 1 for k in SLATE_SIZES) * len(slate_policy_mechanisms())  # one-shot mechanisms at k > 1
    assert table.height == len(POLICY_EPSILONS) * (len(SLATE_SIZES) * len(policy_mechanisms()) + slates)
    assert info.extra["slate_mechanisms"] == list(slate_policy_mechanisms()) == ["oneshot", "gumbel", "clm"]
    t = PolicyTable.from_frame(table)
    assert t.resolve(1.0) in policy_mechanisms()
    # synthetic scores correlate positively with Δ (median ρ > 0): mGEM beats GEM everywhere
    mse = {(r["epsilon"], r["k"], r["mechanism"]): r["expected_mse"] for r in table.iter_rows(named=True)}
    assert all(mse[(e, k, "mgem")] < mse[(e, k, "gem")] for e in POLICY_EPSILONS for k in SLATE_SIZES)


def test_recsvc_policy_rebuilds_the_same_bytes_atomically(tiny: Path, tmp_path: Path, capsys, snapshot) -> None:
    copy = tmp_path / "copy"
    os.system(f"cp -a {tiny} {copy}")
    before = snapshot(copy)
    assert main(["policy", "--artifacts", str(copy), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "`auto` policy table: 21 ε × k ∈ [1, 5, 10] on 60 population users" in out and "k=1: " in out
    assert snapshot(copy).keys() == before.keys()
    assert {k: v for k, v in snapshot(copy).items() if k != "manifest.json"} == {
        k: v for k, v in before.items() if k != "manifest.json"
    }
    assert _manifest(copy) == _manifest(tiny)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # no staging directory left behind
    # Other settings give another table, recorded in the manifest; the other files are untouched.
    assert main(["policy", "--artifacts", str(copy), "--trials", "7", "--users", "20", "--workers", "1"]) == 0
    info = load_artifact(copy).manifest.policy
    assert info is not None
    assert (info.trials, info.users) == (7, 20)
    assert (copy / POLICY).read_bytes() != before[POLICY]
    assert all((copy / f).read_bytes() == before[f] for f in ("candidates.parquet", "model/W1.npz", POPULATION))


def test_recsvc_policy_bad_input_is_one_line_and_changes_nothing(
    tiny: Path, tmp_path: Path, snapshot, one_line_error
) -> None:
    missing = tmp_path / "nope"
    assert main(["policy", "--artifacts", str(missing)]) == 2
    one_line_error(rf"recsvc policy: error: artifact directory {missing} does not exist")
    assert not missing.exists() and list(tmp_path.iterdir()) == []

    old = make_artifact(tmp_path / "old")  # written without population.parquet (older artifact)
    before = snapshot(old)
    assert main(["policy", "--artifacts", str(old)]) == 2
    one_line_error(
        r"has no population.parquet \(written before the `auto` policy table existed\); "
        r"rebuild the artifact with `recsvc prep`"
    )
    assert snapshot(old) == before

    copy = tmp_path / "copy"
    os.system(f"cp -a {tiny} {copy}")
    before = snapshot(copy)
    assert main(["policy", "--artifacts", str(copy), "--trials", "0"]) == 2
    one_line_error(r"recsvc policy: error: --trials must be an integer ≥ 1, got 0")
    with open(copy / POPULATION, "ab") as f:
        f.write(b"x")
    assert main(["policy", "--artifacts", str(copy)]) == 2
    one_line_error(r"population.parquet is corrupt: sha256")
    (copy / POPULATION).write_bytes(before[POPULATION])
    assert snapshot(copy) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "old"]


def test_a_crash_while_rebuilding_leaves_the_artifact_as_it_was(
    tiny: Path, tmp_path: Path, monkeypatch, snapshot
) -> None:
    copy = tmp_path / "copy"
    os.system(f"cp -a {tiny} {copy}")
    before = snapshot(copy)

    def boom(*a, **k):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(policy_cmd.ArtifactWriter, "write_policy", boom)
    with pytest.raises(RuntimeError):
        policy_cmd.rebuild(copy, users=3, trials=2, workers=1, progress=False)
    assert snapshot(copy) == before and sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


def test_an_artifact_without_a_table_stays_readable(tmp_path: Path) -> None:
    art = load_artifact(make_artifact(tmp_path / "old"))
    assert art.policy is None and art.manifest.policy is None and not art.has_population
    assert art.candidate_matrix().count.sum() > 0


def test_population_frame_reads_back_as_the_matrix_prep_computed_on(tiny: Path) -> None:
    """population.parquet holds raw scores of items with clip ranges: clipping them gives what the
    table was computed on (the same rows `recsvc policy` reads)."""
    art = load_artifact(tiny)
    pop = art.population_matrix()
    frame = pl.read_parquet(tiny / POPULATION)
    assert frame.height == int(pop.count.sum()) and frame["user_id"].n_unique() == 60
    q = pop.clipped()
    ok = pop.item_index >= 0
    assert (q[ok] >= pop.lo[ok]).all() and (q[ok] <= pop.hi[ok]).all() and np.isfinite(q[ok]).all()
