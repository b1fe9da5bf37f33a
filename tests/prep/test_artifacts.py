import json

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from recsvc.artifact import ArtifactError, ArtifactWriter, Manifest, SpearmanStats, load_artifact
from recsvc.model import Model
from recsvc.staging import OutputError


def _items():
    lo = np.array([0.0, -1.0, 0.5])
    hi = np.array([1.0, 1.0, 0.5])
    return pl.DataFrame({"item_id": ["a", "b", "c"], "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)})


def _cands():
    return pl.DataFrame(
        {
            "user_id": ["u1", "u1", "u1", "u2", "u2"],
            "rank": [0, 1, 2, 0, 1],
            "item_id": ["a", "b", "c", "c", "a"],
            "score": [2.0, 0.3, 0.1, 0.7, -5.0],
        }
    )


def _write(out, force=False, content=None):
    model = Model(sp.identity(3, format="csr"), sp.identity(3, format="csr"), np.array(["a", "b", "c"]))
    with ArtifactWriter(out, force=force) as w:
        w.write_items(_items())
        w.write_candidates(_cands())
        w.write_model(model)
        return w.commit({"dataset": "toy"} if content is None else content)


def test_roundtrip_and_candidate_matrix(tmp_path):
    out = _write(tmp_path / "toy")
    art = load_artifact(out)
    assert art.manifest.dataset == "toy"
    assert set(art.manifest.files) == {
        "items.parquet",
        "candidates.parquet",
        "candidates/user_ids.npy",
        "candidates/item_index.npy",
        "candidates/scores.npy",
        "model/W1.npz",
        "model/W2.npz",
        "model/items.parquet",
    }
    m = art.candidate_matrix()
    assert m.user_ids.tolist() == ["u1", "u2"]
    assert m.count.tolist() == [3, 2]
    np.testing.assert_array_equal(m.item_index, [[0, 1, 2], [2, 0, -1]])
    clipped = m.clipped()
    np.testing.assert_allclose(clipped[0], [1.0, 0.3, 0.5])
    np.testing.assert_allclose(clipped[1, :2], [0.5, 0.0])
    assert m.sensitivity[1, 2] == 1.0 and np.isneginf(m.scores[1, 2])
    x = sp.csr_matrix(np.array([[1.0, 0, 2.0]]))
    np.testing.assert_allclose(art.model.score(x), [[1.0, 0.0, 2.0]])


def test_existing_output_refused_without_force(tmp_path):
    out = _write(tmp_path / "toy")
    before = (out / "manifest.json").read_text()
    with pytest.raises(OutputError, match="already exists; pass force"):
        _write(out)
    assert (out / "manifest.json").read_text() == before
    _write(out, force=True)
    assert load_artifact(out).manifest.dataset == "toy"


def test_crash_leaves_nothing(tmp_path):
    out = tmp_path / "toy"
    with pytest.raises(RuntimeError), ArtifactWriter(out) as w:
        w.write_items(_items())
        raise RuntimeError("crash mid-write")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_corrupt_file_detected(tmp_path):
    out = _write(tmp_path / "toy")
    with open(out / "candidates.parquet", "ab") as f:
        f.write(b"x")
    with pytest.raises(ArtifactError, match=r"candidates.parquet is corrupt"):
        load_artifact(out)


def test_bad_items_rejected(tmp_path):
    bad = _items().with_columns(pl.Series("sensitivity", [1.0, 1.0, 1.0]))
    with pytest.raises(ArtifactError, match="sensitivity must equal"), ArtifactWriter(tmp_path / "x") as w:
        w.write_items(bad)
    assert not (tmp_path / "x").exists()


def test_missing_directory_message(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist; build it with `recsvc prep`"):
        load_artifact(tmp_path / "nope")


def test_manifest_that_is_not_an_object_is_a_clear_error(tmp_path):
    out = _write(tmp_path / "toy")
    (out / "manifest.json").write_text("[]")
    with pytest.raises(ArtifactError, match="holds a JSON list; expected an object"):
        load_artifact(out)


def test_artifact_writer_error_outside_with_and_after_commit(tmp_path):
    w = ArtifactWriter(tmp_path / "toy")
    with pytest.raises(RuntimeError, match="ArtifactWriter used outside its `with` block"):
        w.write_items(_items())
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The typed manifest


def _manifest_json(out):
    return json.loads((out / "manifest.json").read_text())


def test_manifest_fields_are_typed_and_round_trip(tmp_path):
    rho = {"median": 0.25, "mean": 0.5, "frac_positive": 0.75, "users": 4}
    out = _write(
        tmp_path / "toy",
        content={
            "dataset": "toy",
            "seed": 3,
            "population_spearman": rho,
            "percentiles": [1.0, 99.0],
            "note": {"free": [1, 2]},
        },
    )
    m = load_artifact(out).manifest
    assert (m.format_version, m.dataset, m.seed, m.percentiles) == (1, "toy", 3, (1.0, 99.0))
    assert m.population_spearman == SpearmanStats(median=0.25, mean=0.5, frac_positive=0.75, users=4)
    assert m.extra == {"note": {"free": [1, 2]}} and m.split is None and m.sansa is None
    raw = _manifest_json(out)
    assert m.to_dict() == raw and Manifest.from_dict(m.to_dict()) == m
    assert (out / "manifest.json").read_text() == json.dumps(m.to_dict(), indent=2, sort_keys=True) + "\n"


def test_manifest_keeps_integers_and_numpy_values_as_written(tmp_path):
    """Values are checked, never coerced: an int stays an int, so the JSON bytes do not change."""
    out = _write(
        tmp_path / "toy",
        content={
            "dataset": "toy",
            "seed": np.int64(7),
            "accuracy": {"r@20": np.float64(0.5)},
            "timings_s": {"total": 2},
        },
    )
    raw = (out / "manifest.json").read_text()
    assert '"seed": 7,' in raw and '"total": 2\n' in raw and '"r@20": 0.5' in raw
    m = load_artifact(out).manifest
    assert type(m.seed) is int and m.timings_s == {"total": 2} and type(m.timings_s["total"]) is int


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("dataset"), r"manifest.json: required field 'dataset' is missing; expected a string"),
        (lambda d: d.pop("format_version"), r"required field 'format_version' is missing; expected an integer"),
        (lambda d: d.pop("files"), r"required field 'files' is missing; expected a non-empty object of file → sha256"),
        (
            lambda d: d["population_spearman"].pop("median"),
            r"required field 'population_spearman.median' is missing; expected a number",
        ),
        (lambda d: d.update(seed="7"), r"field 'seed' is a JSON str \('7'\); expected an integer"),
        (lambda d: d.update(seed=True), r"field 'seed' is a JSON bool \(True\); expected an integer"),
        (lambda d: d.update(dataset=None), r"field 'dataset' is null; expected a string"),
        (
            lambda d: d.update(percentiles=[1.0]),
            r"field 'percentiles' is a JSON list \(\[1.0\]\); expected a list of two",
        ),
    ],
)
def test_manifest_missing_or_mistyped_field_is_a_clear_error(tmp_path, change, message):
    out = _write(
        tmp_path / "toy",
        content={
            "dataset": "toy",
            "population_spearman": {"median": 0.1, "mean": 0.1, "frac_positive": 0.5, "users": 3},
        },
    )
    data = _manifest_json(out)
    change(data)
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=message):
        load_artifact(out)
    with pytest.raises(ArtifactError, match=message.replace("manifest.json: ", "")):
        Manifest.from_dict(data)


def test_writer_refuses_a_manifest_without_a_required_field_and_publishes_nothing(tmp_path):
    with pytest.raises(ArtifactError, match=r"manifest of .*toy: required field 'dataset' is missing"):
        _write(tmp_path / "toy", content={"seed": 1})
    assert list(tmp_path.iterdir()) == []
