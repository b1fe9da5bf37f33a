"""Bad candidate arrays (``candidates/*.npy``) are clear errors naming the file; the writer builds
them only over items.parquet's rows."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from recsvc.artifact import ArtifactError, ArtifactWriter, load_artifact
from recsvc.artifact.format import CANDIDATE_ARRAYS_DIR


def _write(out):
    lo, hi = np.array([0.0, -1.0, 0.5]), np.array([1.0, 1.0, 0.5])
    items = pl.DataFrame({"item_id": ["a", "b", "c"], "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)})
    cands = (
        pl.DataFrame(
            {"user_id": ["u2", "u2", "u1", "u1", "u1"], "rank": [0, 1, 0, 1, 2], "item_id": ["c", "a", "a", "b", "c"]}
        )
        .with_columns(pl.Series("score", [0.7, -5.0, 2.0, 0.3, 0.1]))
        .cast({"rank": pl.Int32})
    )
    with ArtifactWriter(out) as w:
        w.write_items(items)
        w.write_candidates(cands)
        return w.commit({"dataset": "toy"})


def test_arrays_hold_the_table_sorted_by_user_and_rank(tmp_path):
    d = _write(tmp_path / "toy") / CANDIDATE_ARRAYS_DIR
    assert np.load(d / "user_ids.npy").tolist() == ["u1", "u2"]
    idx, scores = np.load(d / "item_index.npy"), np.load(d / "scores.npy")
    assert idx.dtype == np.int32 and scores.dtype == np.float64
    np.testing.assert_array_equal(idx, [[0, 1, 2], [2, 0, -1]])
    np.testing.assert_array_equal(scores, [[2.0, 0.3, 0.1], [0.7, -5.0, -np.inf]])


def test_corrupt_array_is_named_by_the_checksum(tmp_path):
    out = _write(tmp_path / "toy")
    with open(out / CANDIDATE_ARRAYS_DIR / "scores.npy", "r+b") as f:
        f.seek(-8, 2)
        f.write(np.float64(9.0).tobytes())
    with pytest.raises(ArtifactError, match=r"candidates/scores.npy is corrupt: sha256"):
        load_artifact(out)


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("scores.npy", lambda p: p.write_bytes(p.read_bytes()[:-20]), r"scores.npy is not a readable .npy array"),
        ("item_index.npy", lambda p: p.write_bytes(b"not an array"), r"item_index.npy is not a readable .npy array"),
        ("scores.npy", lambda p: np.save(p, np.zeros((2, 3), np.float32)), r"expected int32 and float64"),
        (
            "user_ids.npy",
            lambda p: np.save(p, np.array([1, 2])),
            r"user_ids.npy: dtype int64, shape \(2,\); expected 1 dimensions of dtype kind 'U'",
        ),
        ("user_ids.npy", lambda p: np.save(p, np.array(["u1"])), r"disagree; expected \(U,\), \(U, n\)"),
        (
            "item_index.npy",
            lambda p: np.save(p, np.array([[0, -1, 2], [2, 0, -1]], np.int32)),
            r"item_index.npy, users 0..1: .* gap",
        ),
        ("item_index.npy", lambda p: np.save(p, np.array([[0, 1, 3], [2, 0, -1]], np.int32)), r"outside −1..2"),
        ("scores.npy", lambda p: np.save(p, np.array([[2.0, 0.3, 0.1], [0.7, -5.0, 1.0]])), r"−inf padding"),
    ],
)
def test_bad_array_is_a_clear_error_naming_the_file(tmp_path, name, damage, message):
    """Even unverified (load_artifact(verify=False)), a damaged array is refused when read."""
    out = _write(tmp_path / "toy")
    damage(out / CANDIDATE_ARRAYS_DIR / name)
    art = load_artifact(out, verify=False)
    with pytest.raises(ArtifactError, match=message):
        art.candidate_matrix()


def test_candidates_before_items_is_refused_and_writes_nothing(tmp_path):
    cands = pl.DataFrame({"user_id": ["u"], "rank": [0], "item_id": ["a"], "score": [1.0]}).cast({"rank": pl.Int32})
    with pytest.raises(ArtifactError, match=r"before items\.parquet"), ArtifactWriter(tmp_path / "x") as w:
        w.write_candidates(cands)
    assert list(tmp_path.iterdir()) == []
