"""End-to-end `recsvc prep`: CLI on tiny synthetic data, byte-identical reruns, Dask = local,
atomic writes, bad input (clear error, exit 2, nothing written), real ml-100k."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import data_prep.pipeline as pipeline
from data_prep.pipeline import PrepConfig, run
from data_prep.testing import ml20m_prep, ratings_table, tiny_prep, write_amazon, write_ml20m
from recsvc.app.cli import main
from recsvc.artifact import Manifest, SansaInfo, SpearmanStats, SplitInfo, load_artifact

# A small `auto` policy table keeps these runs fast; test_policy_artifact.py covers the default one.
TINY = [
    "prep",
    "--dataset",
    "synthetic",
    "--preset",
    "tiny",
    "--workers",
    "1",
    "--chunk-users",
    "16",
    "--policy-users",
    "20",
    "--policy-trials",
    "5",
]
FILES = (
    "items.parquet",
    "candidates.parquet",
    "model/W1.npz",
    "model/W2.npz",
    "model/items.parquet",
    "population.parquet",
    "policy.parquet",
    "test_inputs.parquet",
    "test_targets.parquet",
)


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir()) if path.parent.exists() else []


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "art"
    assert main([*TINY, "--out", str(out)]) == 0
    return out


def test_manifest_of_a_built_artifact_round_trips_to_the_same_bytes(tiny_artifact: Path) -> None:
    """Every key the pipeline writes is a typed field (nothing left in ``extra`` but the records
    no consumer reads), and the typed manifest writes back to exactly the file's bytes."""
    text = (tiny_artifact / "manifest.json").read_text()
    m = load_artifact(tiny_artifact).manifest
    assert Manifest.from_dict(m.to_dict()) == m and m.to_dict() == json.loads(text)
    assert json.dumps(m.to_dict(), indent=2, sort_keys=True) + "\n" == text
    assert isinstance(m.split, SplitInfo) and isinstance(m.sansa, SansaInfo)
    assert isinstance(m.population_spearman, SpearmanStats)
    assert set(m.extra) == {"engine", "synthetic"} and not m.split.extra and not m.sansa.extra
    assert (m.format_version, m.candidates_per_user, m.sansa.selected_on, m.sansa.grid) == (1, 500, "fixed", ())
    assert m.sensitivity_population_users == 60 and m.items_without_population_scores == 0
    assert m.timings_s is not None and m.timings_s["total"] > 0 and m.source is not None


def test_cli_end_to_end(tiny_artifact: Path, capsys) -> None:
    art = load_artifact(tiny_artifact)
    m = art.manifest
    assert m.split is not None and m.accuracy is not None and m.population_spearman is not None
    assert m.versions is not None
    assert m.dataset == "synthetic" and m.seed == 42
    assert m.split.test_users == 60 and m.split.validation_users == 60
    assert m.sensitivity_population == "validation" and m.percentiles == (1.0, 99.0)
    assert set(m.accuracy) == {"recall@20", "recall@50", "ndcg@100", "bars_recall@20", "ndcg@20"}
    # The clustered synthetic data is learnable: far better than random (≈ 20/150 items).
    assert m.accuracy["recall@20"] > 0.3
    assert set(m.population_spearman.to_dict()) == {"median", "mean", "frac_positive", "users"}
    assert m.population_spearman.users == 60
    assert {"numpy", "sansa", "polars"} <= set(m.versions)
    cands = art.candidates
    # Top-500 of 150 items: every unseen item, ranked by score descending, no seen items.
    per_user = cands.group_by("user_id").agg(pl.len(), pl.col("score").diff().max().alias("up"), pl.col("rank").max())
    assert per_user.height == 60 and (per_user["up"].fill_null(0) <= 0).all()
    assert (per_user["rank"] == per_user["len"] - 1).all()
    cm = art.candidate_matrix()
    split, _, _ = pipeline._load_and_split(tiny_prep(tiny_artifact), pipeline.datasets.INFO["synthetic"])
    assert list(split.test.user_ids) == cm.user_ids.tolist()
    seen = split.test.inputs.toarray() > 0
    assert (cm.count == 150 - seen.sum(axis=1)).all()
    rows = np.repeat(np.arange(len(cm.count)), cm.item_index.shape[1]).reshape(cm.item_index.shape)
    assert not seen[rows[cm.item_index >= 0], cm.item_index[cm.item_index >= 0]].any()
    items = art.items
    assert items.height == 150 and (items["sensitivity"] >= 1e-6).all() and (items["hi"] >= items["lo"]).all()


def test_candidates_are_model_scores(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    cm = art.candidate_matrix(users=5)
    # Recompute: the raw score stored equals x @ W1 @ W2 for that user and item; seen items excluded.
    cands = art.candidates.filter(pl.col("user_id").is_in(cm.user_ids.tolist()))
    assert cands.height == int(cm.count.sum())
    valid = cm.item_index >= 0
    assert np.isfinite(cm.scores[valid]).all() and np.isneginf(cm.scores[~valid]).all()
    model = art.model
    split, _, _ = pipeline._load_and_split(tiny_prep(tiny_artifact), pipeline.datasets.INFO["synthetic"])
    dense = model.score(split.test.inputs[:5])
    rows = np.broadcast_to(np.arange(5)[:, None], valid.shape)
    # item_index is the row in items.parquet, which is the model's column order.
    assert list(art.items["item_id"]) == list(model.item_ids)
    np.testing.assert_array_equal(cm.scores[valid], dense[rows[valid], cm.item_index[valid]])


def test_test_inputs_and_targets_are_the_splits_held_out_items(tiny_artifact: Path) -> None:
    art = load_artifact(tiny_artifact)
    split, _, _ = pipeline._load_and_split(tiny_prep(tiny_artifact), pipeline.datasets.INFO["synthetic"])
    inputs, targets = art.test_items(art.user_ids)
    row = {u: i for i, u in enumerate(split.test.user_ids.tolist())}
    assert split.test.targets is not None
    x, t = split.test.inputs.tocsr(), split.test.targets.tocsr()
    for u, got_in, got_t in zip(art.user_ids.tolist(), inputs, targets, strict=True):
        b = row[u]
        np.testing.assert_array_equal(got_in, np.sort(x.indices[x.indptr[b] : x.indptr[b + 1]]))
        np.testing.assert_array_equal(got_t, np.sort(t.indices[t.indptr[b] : t.indptr[b + 1]]))
        assert len(got_t) >= 1 and not np.isin(got_t, got_in).any()
    empty_in, empty_t = art.test_items(np.array(["no-such-user"]))
    assert empty_in[0].size == 0 and empty_t[0].size == 0


def test_rerun_is_byte_identical(tiny_artifact: Path, tmp_path: Path) -> None:
    """Dask on a real cluster: test_prep_dask_cluster.py."""
    again = run(tiny_prep(tmp_path / "again", chunk_users=7))
    for f in FILES:
        assert (again / f).read_bytes() == (tiny_artifact / f).read_bytes(), f


def test_sensitivity_population_test_and_percentiles(tmp_path: Path) -> None:
    out = run(tiny_prep(tmp_path / "t", sensitivity_population="test", percentiles=(5.0, 95.0)))
    m = json.loads((out / "manifest.json").read_text())
    assert m["sensitivity_population"] == "test" and m["percentiles"] == [5.0, 95.0]
    ref = load_artifact(out).items
    wide = run(tiny_prep(tmp_path / "w", sensitivity_population="test", percentiles=(1.0, 99.0)))
    # Wider percentiles never give a narrower range.
    assert (load_artifact(wide).items["sensitivity"].to_numpy() >= ref["sensitivity"].to_numpy() - 1e-12).all()


def test_existing_output_needs_force(tiny_artifact: Path, capsys) -> None:
    before = (tiny_artifact / "manifest.json").read_bytes()
    assert main([*TINY, "--out", str(tiny_artifact)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert (tiny_artifact / "manifest.json").read_bytes() == before


def test_crash_leaves_no_partial_artifact(tmp_path: Path, monkeypatch) -> None:
    def boom(*a, **k):
        raise RuntimeError("simulated crash")

    out = tmp_path / "x" / "art"
    monkeypatch.setattr(pipeline, "population_spearman", boom)
    with pytest.raises(RuntimeError):
        run(tiny_prep(out))
    assert not out.exists() and _siblings(out) == []  # no tmp or scratch dirs left behind
    # With --force over a good artifact, a crash keeps the old artifact intact.
    monkeypatch.undo()
    run(tiny_prep(out))
    good = (out / "candidates.parquet").read_bytes()
    monkeypatch.setattr(pipeline, "population_spearman", boom)
    with pytest.raises(RuntimeError):
        run(tiny_prep(out, force=True))
    assert (out / "candidates.parquet").read_bytes() == good and _siblings(out) == ["art"]
    load_artifact(out)


def test_crash_after_the_scratch_dir_removes_the_parents_it_made(tmp_path: Path, monkeypatch) -> None:
    made: list[Path] = []
    real = pipeline._sensitivities

    def crash(cfg, engine, model, group, scratch, timer):  # scratch/ sits next to out in the new a/b/
        made.append(scratch)
        real(cfg, engine, model, group, scratch, timer)
        raise RuntimeError("simulated crash after the population scores")

    monkeypatch.setattr(pipeline, "_sensitivities", crash)
    out = tmp_path / "a" / "b" / "c"  # a/ does not exist yet
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(tiny_prep(out))
    assert made and made[0].parent == out.parent and made[0].name.startswith(".c.scratch-")
    assert list(tmp_path.iterdir()) == []  # no a/, no temp or scratch dir


@pytest.mark.parametrize(
    "setup, args, message",
    [
        (
            "none",
            ["--dataset", "ml-20m"],
            r"ratings\.csv not found; expected a CSV with header userId,movieId,rating,timestamp",
        ),
        ("malformed", ["--dataset", "ml-20m"], r"ratings\.csv, line 4: malformed line"),
        ("low", ["--dataset", "ml-20m"], r"no interactions left after filtering \(rating ≥ 4"),
        ("ok", ["--dataset", "ml-20m"], r"users after filtering, fewer than the split needs \(10000 test"),
        ("ok", ["--dataset", "ml-20m", "--percentiles", "99", "1"], r"percentiles must satisfy 0 ≤ lo < hi ≤ 100"),
        (
            "ok",
            ["--dataset", "ml-20m", "--l2", "-1", "--test-users", "5", "--val-users", "5"],
            r"--l2 must be one or more values, each a finite number > 0",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path: Path, setup, args, message, prep_error_line) -> None:
    data = tmp_path / "data"
    data.mkdir()
    table = ratings_table(users=40, items=30, per_user=(8, 20))
    if setup != "none":
        write_ml20m(data, table)
    if setup == "malformed":
        lines = (data / "ratings.csv").read_text().splitlines()
        lines[3] = "1,2,x,4"
        (data / "ratings.csv").write_text("\n".join(lines) + "\n")
    if setup == "low":
        write_ml20m(data, table.with_columns(pl.lit(2.0).alias("rating")))
    out = tmp_path / "out" / "art"
    code = main(["prep", *args, "--data-dir", str(data), "--out", str(out), "--workers", "1"])
    assert code == 2
    assert re.search(message, prep_error_line())
    assert not out.exists() and _siblings(out) == []


def test_ml20m_fixture_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_ml20m(data, ratings_table(users=80, items=40, per_user=(10, 30), seed=5), kaggle=True)
    out = run(ml20m_prep(data, tmp_path / "a"))
    m = load_artifact(out).manifest
    assert m.split is not None and m.sansa is not None
    assert m.split.test_users == 10 and m.split.validation_users == 10
    assert m.sansa.l2 == 10.0 and m.sansa.factorizer == "cholmod"
    assert m.sansa.umr_scans == 5  # glami/sansa's ML-20M reproduction setting


def test_real_ml100k_end_to_end(ml100k: Path) -> None:
    """The embedded default: RecBole's ml-100k.inter read out of the recbole 1.2.1 wheel."""
    out = ml100k
    art = load_artifact(out)
    m = art.manifest
    assert m.split is not None and m.sansa is not None and m.accuracy is not None
    assert m.population_spearman is not None
    assert m.dataset == "ml-100k" and m.split.test_users == 100 and m.split.validation_users == 100
    assert m.split.items > 1000 and m.split.train_users > 700
    assert m.sansa.selected_on == "validation ndcg@100" and len(m.sansa.grid) == 6
    assert m.accuracy["recall@20"] > 0.3 and m.accuracy["ndcg@100"] > 0.3
    assert art.candidates.group_by("user_id").len()["len"].max() == 500
    # The paper's real-data finding (§VII): MovieLens scores correlate positively with Δ, so
    # mGEM beats RNM, which beats GEM, with mGEM's 95% CI clear of RNM's. Exact probabilities.
    from eval.evaluation.config import EvalConfig
    from eval.evaluation.run import run as evaluate

    assert m.population_spearman.median > 0.3
    res = evaluate(
        EvalConfig(
            artifacts=out,
            mechanisms=("rnm", "gem", "mgem"),
            epsilons=(0.1, 1.0, 4.0),
            exact=True,
            progress=False,
            workers=1,
        )
    )
    t = {(r["mechanism"], r["epsilon"]): r for r in res.mse.iter_rows(named=True)}
    for eps in (0.1, 1.0, 4.0):
        mgem, rnm, gem = (t[(k, eps)] for k in ("mgem", "rnm", "gem"))
        assert mgem["mse_mean"] < rnm["mse_mean"] < gem["mse_mean"], eps
        assert mgem["ci_high"] < rnm["ci_low"], eps


def test_amazon_book_fixture_end_to_end(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(3)
    train = {u: sorted(rng.choice(30, size=8, replace=False).tolist()) for u in range(40)}
    test = {u: sorted(set(rng.choice(30, size=3, replace=False).tolist()) - set(train[u])) for u in range(0, 40, 2)}
    test = {u: items for u, items in test.items() if items}
    write_amazon(tmp_path / "data", train, test)
    out = run(
        PrepConfig(
            dataset="amazon-book",
            data_dir=tmp_path / "data",
            out=tmp_path / "a",
            l2=(5.0,),
            density=(0.2,),
            factorizer="cholmod",
            population_users=25,
            workers=1,
            progress=False,
        )
    )
    art = load_artifact(out)
    m = art.manifest
    assert m.split is not None and m.sansa is not None and m.accuracy is not None
    assert m.sensitivity_population == "sample" and m.sensitivity_population_users == 25
    assert m.sansa.umr_scans == 3  # glami/sansa's Amazon-book reproduction setting
    assert m.split.test_users == len(test) and m.split.train_users == 40
    assert m.split.train_interactions == 40 * 8 and "validation_users" not in m.split.to_dict()
    # The weak-generalisation protocol's metrics (hits / |targets|, nDCG@20) are the ones shown.
    acc = m.accuracy
    assert 0 < acc["bars_recall@20"] <= acc["recall@20"] and 0 < acc["ndcg@20"] <= 1
    from data_prep.cli import print_summary

    print_summary(out)
    shown = capsys.readouterr().out
    assert f"Recall@20 (hits/|targets|) {acc['bars_recall@20']:.4f}  nDCG@20 {acc['ndcg@20']:.4f}" in shown
    # Candidates never include the user's train.txt items (their input).
    cands = art.candidates
    for u, items in train.items():
        got = set(cands.filter(pl.col("user_id") == str(u))["item_id"].to_list())
        assert not got & {str(i) for i in items}
        if u in test:
            assert len(got) == 30 - 8


def _peak_sensitivity_bytes(users: int, tmp_path: Path) -> tuple[int, dict]:
    """Peak traced allocation (numpy reports to tracemalloc) of population scoring, percentiles
    and population Spearman for ``users`` users, in chunks of 100 users."""
    import tracemalloc

    import scipy.sparse as sp

    from data_prep.pipeline import PrepConfig, _sensitivities, _Timer
    from data_prep.sensitivities import population_spearman
    from data_prep.split import UserGroup
    from recsvc.engines import LocalEngine
    from recsvc.model import Model

    items = 600
    rng = np.random.default_rng(0)
    w = sp.random(items, items, density=0.05, random_state=1, format="csr")
    model = Model(sp.identity(items, format="csr"), w, np.arange(items).astype(str))
    inputs = sp.random(users, items, density=0.02, random_state=2, format="csr", dtype=np.float32)
    inputs.data[:] = 1.0
    group = UserGroup(np.arange(users).astype(str), inputs, None)
    cfg = PrepConfig(chunk_users=100, progress=False)
    scratch = tmp_path / f"scratch-{users}"
    scratch.mkdir()
    tracemalloc.start()
    try:
        ranges, top = _sensitivities(cfg, LocalEngine(1, progress=False), model, group, scratch, _Timer())
        rho = population_spearman(top, ranges, cfg.chunk_users)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del rng
    return peak, rho


def test_sensitivity_memory_does_not_grow_with_population(tmp_path: Path, monkeypatch) -> None:
    # Percentiles read one item block of at most BLOCK_BYTES; shrink it so that both sizes
    # below use many blocks, as ML-20M-sized populations do with the 64 MiB default.
    monkeypatch.setattr("data_prep.sensitivities.BLOCK_BYTES", 256 << 10)
    small, rho_small = _peak_sensitivity_bytes(400, tmp_path)
    large, rho_large = _peak_sensitivity_bytes(3200, tmp_path)
    assert rho_small["users"] == 400 and rho_large["users"] == 3200
    # 8× the users: dense scores alone would be 8× (3200 × 600 × 8 B = 15 MB vs 1.9 MB), the
    # top-500 lists 8× too. Chunking keeps the peak flat; only the ρ values (8 B/user) grow.
    assert large < 1.3 * small, (small, large)


def test_the_wheel_download_finds_a_pip_even_in_a_venv_made_without_one() -> None:
    """scripts/setup.sh makes .venv without pip (uv installs into it); the ml-100k wheel is then
    fetched by the interpreter the venv was made from, which has pip."""
    import subprocess

    from data_prep.datasets.movielens import _pip_python

    proc = subprocess.run([_pip_python(), "-m", "pip", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pip ")
