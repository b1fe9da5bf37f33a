"""The serving bundle: `recsvc serving-bundle` keeps only public files, `recsvc serve` starts from
it alone, and its content does not depend on any test user's data."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from data_prep.pipeline import run
from data_prep.testing import ml20m_prep, ratings_table, write_ml20m
from recsvc.app.cli import main as recsvc_main
from recsvc.artifact import ArtifactError, load_artifact, write_serving_bundle
from recsvc.service.testing import client_of, served

# Manifest fields that vary between two runs on the same public data (wall times) or describe the
# whole split's sizes, or name the input file; every other byte of the bundle must be the same.
_RUN_FIELDS = ("timings_s", "split", "source")


def _prep(data: Path, out: Path) -> Path:
    return run(ml20m_prep(data, out, policy_users=10, policy_trials=3))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two artifacts of the same public users whose TEST users' histories differ."""
    root = tmp_path_factory.mktemp("bundle")
    table = ratings_table(users=80, items=40, per_user=(10, 30), seed=5)
    write_ml20m(root / "data1", table, kaggle=True)
    first = _prep(root / "data1", root / "a1")
    test_users = set(load_artifact(first).user_ids.tolist())
    # Every test user's history is replaced by a different one (items shifted by 7 in 1..40).
    shifted = pl.col("item").cast(pl.Int64).map_elements(lambda i: str((i + 6) % 40 + 1), return_dtype=pl.String)
    changed = table.with_columns(
        pl.when(pl.col("user").is_in(sorted(test_users))).then(shifted).otherwise(pl.col("item")).alias("item")
    ).unique(subset=["user", "item"], keep="first")
    write_ml20m(root / "data2", changed, kaggle=True)
    second = _prep(root / "data2", root / "a2")
    return first, second


def _bundle_files(bundle: Path) -> dict[str, bytes]:
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file()}


def test_bundle_holds_only_public_files_and_no_per_user_row(artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    bundle = write_serving_bundle(artifacts[0], tmp_path / "b")
    files = set(_bundle_files(bundle))
    client = {f"client/{n}" for n in ("manifest.json", "item_ids.json", "codebook.json", "embedding.npy")} | {
        f"client/w{w}_{part}.npy" for w in (1, 2) for part in ("indptr", "indices", "data")
    }
    multiselect = {f"multiselect/{n}.npy" for n in ("embeddings", "top_index", "top_score")}
    assert files == {
        "manifest.json",
        "items.parquet",
        "policy.parquet",
        "model/W1.npz",
        "model/W2.npz",
        "model/items.parquet",
        *client,
        *multiselect,
    }
    art = load_artifact(bundle)
    assert art.is_serving_bundle and art.manifest.kind == "serving"
    n_items = art.items.height
    for rel in files:
        if rel.endswith(".parquet"):
            frame = pl.read_parquet(bundle / rel)
            assert "user_id" not in frame.columns, rel
            assert frame.height <= max(n_items, len(art.policy) if art.policy is not None else 0), rel
    # multi-selection's population: each row the mean of ≥ 2 training users, none one user's own.
    info = art.manifest.multiselect
    assert info is not None and info.group >= 2 and info.prototypes * info.group <= info.users
    assert art.multiselect_population.embeddings.shape[0] == info.prototypes
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert not {"accuracy", "accuracy_users", "candidates_per_user"} & set(manifest)
    with pytest.raises(ArtifactError, match=r"serving bundle: it holds no candidates\.parquet"):
        _ = art.candidates
    with pytest.raises(ArtifactError, match=r"holds no population\.parquet"):
        art.population_matrix()


def test_bundle_does_not_depend_on_the_test_users(artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    full1, full2 = (load_artifact(a) for a in artifacts)
    assert not full1.candidates.equals(full2.candidates)  # the change reached the per-user files
    b1, b2 = (_bundle_files(write_serving_bundle(a, tmp_path / f"b{i}")) for i, a in enumerate(artifacts))
    m1, m2 = (json.loads(b.pop("manifest.json")) for b in (b1, b2))
    assert b1 == b2  # every data file byte for byte
    for name in (*_RUN_FIELDS, "files"):
        m1.pop(name, None), m2.pop(name, None)
    assert m1 == m2


def test_serve_starts_from_the_bundle_alone(artifacts: tuple[Path, Path], tmp_path: Path) -> None:
    bundle = write_serving_bundle(artifacts[0], tmp_path / "b")
    with served(bundle, tmp_path / "ledger.db", budget=5.0) as handle, client_of(handle) as c:
        info = c.mechanisms()
        assert info.catalog_size == load_artifact(bundle).items.height > 0
        r = c.recommend("u1", ["1", "2", "3"], "rnm", 0.5, request_id="r1", k=3)
        assert len(set(r.item_ids)) == 3 and r.epsilon_spent == pytest.approx(0.5)
        ids = load_artifact(bundle).items["item_id"].to_list()[:5]
        s = c.select("u1", [(i, 0.1 * j) for j, i in enumerate(ids)], "auto", 0.5, request_id="s1")
        assert s.item_id in ids and s.budget_remaining == pytest.approx(4.0)


def test_cli_writes_the_bundle_and_refuses_bad_input_writing_nothing(
    artifacts: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert recsvc_main(["serving-bundle", "--artifacts", str(artifacts[0]), "--out", str(out)]) == 0
    assert f"serving bundle: {out} (18 files: client/codebook.json, client/embedding.npy" in capsys.readouterr().out
    assert recsvc_main(["serving-bundle", "--artifacts", str(out), "--out", str(tmp_path / "x")]) == 2
    assert "already a serving bundle; expected a full artifact" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert recsvc_main(["serving-bundle", "--artifacts", str(artifacts[0]), "--out", str(artifacts[0] / "b")]) == 2
    assert "is inside the --artifacts directory" in capsys.readouterr().err
    assert recsvc_main(["serving-bundle", "--artifacts", str(artifacts[0]), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_eval_refuses_a_serving_bundle_clearly(
    artifacts: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = write_serving_bundle(artifacts[0], tmp_path / "b")
    assert recsvc_main(["eval", "--artifacts", str(bundle), "--out", str(tmp_path / "r"), "--trials", "2"]) != 0
    assert "is a serving bundle: it holds no candidates.parquet" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
