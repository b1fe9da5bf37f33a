from pathlib import Path

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from recsvc.artifacts import ArtifactError, ArtifactWriter, Model, OutputError, load_artifact


def _items():
    lo = np.array([0.0, -1.0, 0.5])
    hi = np.array([1.0, 1.0, 0.5])
    return pl.DataFrame({"item_id": ["a", "b", "c"], "lo": lo, "hi": hi,
                         "sensitivity": np.maximum(hi - lo, 1e-6)})


def _cands():
    return pl.DataFrame({"user_id": ["u1", "u1", "u1", "u2", "u2"], "rank": [0, 1, 2, 0, 1],
                         "item_id": ["a", "b", "c", "c", "a"], "score": [2.0, 0.3, 0.1, 0.7, -5.0]})


def _write(out, force=False):
    model = Model(sp.identity(3, format="csr"), sp.identity(3, format="csr"), np.array(["a", "b", "c"]))
    with ArtifactWriter(out, force=force) as w:
        w.write_items(_items())
        w.write_candidates(_cands())
        w.write_model(model)
        return w.commit({"dataset": "toy"})


def test_roundtrip_and_candidate_matrix(tmp_path):
    out = _write(tmp_path / "toy")
    art = load_artifact(out)
    assert art.manifest["dataset"] == "toy"
    assert set(art.manifest["files"]) == {"items.parquet", "candidates.parquet", "model/W1.npz",
                                          "model/W2.npz", "model/items.parquet"}
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
    with pytest.raises(OutputError, match="already exists; pass --force"):
        _write(out)
    assert (out / "manifest.json").read_text() == before
    _write(out, force=True)
    assert load_artifact(out).manifest["dataset"] == "toy"


def test_crash_leaves_nothing(tmp_path):
    out = tmp_path / "toy"
    with pytest.raises(RuntimeError):
        with ArtifactWriter(out) as w:
            w.write_items(_items())
            raise RuntimeError("crash mid-write")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_corrupt_file_detected(tmp_path):
    out = _write(tmp_path / "toy")
    with open(out / "candidates.parquet", "ab") as f:
        f.write(b"x")
    with pytest.raises(ArtifactError, match="candidates.parquet is corrupt"):
        load_artifact(out)


def test_bad_items_rejected(tmp_path):
    bad = _items().with_columns(pl.Series("sensitivity", [1.0, 1.0, 1.0]))
    with pytest.raises(ArtifactError, match="sensitivity must equal"):
        with ArtifactWriter(tmp_path / "x") as w:
            w.write_items(bad)
    assert not (tmp_path / "x").exists()


def test_missing_directory_message(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist; build it with `recsvc prep`"):
        load_artifact(tmp_path / "nope")


def _dir_with(path, text):
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def test_replace_dir_exchanges_atomically_and_leaves_no_leftovers(tmp_path, monkeypatch):
    import recsvc.artifacts as artifacts
    from recsvc.artifacts import replace_dir

    exchanges = []
    real_exchange = artifacts._exchange
    monkeypatch.setattr(artifacts, "_exchange", lambda a, b: exchanges.append((a, b)) or real_exchange(a, b))
    out = _dir_with(tmp_path / "out", "old")
    assert replace_dir(_dir_with(tmp_path / ".new", "new"), out) == out
    assert exchanges == [(tmp_path / ".new", out)]  # one renameat2(RENAME_EXCHANGE), no window without `out`
    assert (out / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert replace_dir(_dir_with(tmp_path / ".fresh", "x"), tmp_path / "other") == tmp_path / "other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out"]


def test_replace_dir_fallback_restores_the_old_directory_on_failure(tmp_path, monkeypatch):
    import errno
    import os

    import recsvc.artifacts as artifacts

    def no_exchange(a, b):
        raise OSError(errno.ENOSYS, "no renameat2")

    monkeypatch.setattr(artifacts, "_exchange", no_exchange)
    out = _dir_with(tmp_path / "out", "old")
    artifacts.replace_dir(_dir_with(tmp_path / ".new", "new"), out)  # the two-rename fallback works
    assert (out / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    real_replace, calls = os.replace, []

    def failing_second_replace(a, b):
        calls.append(a)
        if len(calls) == 2:
            raise OSError(errno.EIO, "disk error")
        return real_replace(a, b)

    monkeypatch.setattr(artifacts.os, "replace", failing_second_replace)
    with pytest.raises(OSError, match="disk error"):
        artifacts.replace_dir(_dir_with(tmp_path / ".newer", "newer"), out)
    assert (out / "f.txt").read_text() == "new"  # the old directory is back in place


def test_manifest_that_is_not_an_object_is_a_clear_error(tmp_path):
    out = _write(tmp_path / "toy")
    (out / "manifest.json").write_text("[]")
    with pytest.raises(ArtifactError, match="holds a JSON list; expected an object"):
        load_artifact(out)


# ---------------------------------------------------------------------------------------------
# StagedDir: the one way every part stages and publishes an output directory


def _tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_staged_dir_publishes_into_new_parents(tmp_path):
    from recsvc.artifacts import StagedDir

    out = tmp_path / "a" / "b" / "c"
    with StagedDir(out) as s:
        assert s.tmp.parent == out.parent and s.tmp.name.startswith(".c.tmp-") and not out.exists()
        (s.tmp / "f.txt").write_text("new")
        assert s.publish() == out
    assert _tree(tmp_path) == ["a", "a/b", "a/b/c", "a/b/c/f.txt"] and (out / "f.txt").read_text() == "new"


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_staged_dir_failure_removes_temp_and_the_parents_it_made_only(tmp_path, error):
    from recsvc.artifacts import StagedDir

    (tmp_path / "keep").mkdir()
    with pytest.raises(error):
        with StagedDir(tmp_path / "keep" / "new" / "deeper" / "c") as s:
            (s.tmp / "half.txt").write_text("half")
            (tmp_path / "keep" / "new" / "theirs.txt").write_text("x")  # someone else writes into a new parent
            raise error("crash mid-write")
    # deeper/ (empty) went; new/ holds another file, so it stays; keep/ existed before.
    assert _tree(tmp_path) == ["keep", "keep/new", "keep/new/theirs.txt"]
    with pytest.raises(error):
        with StagedDir(tmp_path / "x" / "y" / "c"):
            raise error("crash")
    assert _tree(tmp_path) == ["keep", "keep/new", "keep/new/theirs.txt"]


def test_staged_dir_checks_create_nothing(tmp_path):
    from recsvc.artifacts import StagedDir, check_out

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    existing = tmp_path / "res"
    existing.mkdir()
    (existing / "keep.txt").write_text("earlier")
    for out, force, message in [
        (blocker, True, r"cannot create --out .*a-file: it exists and is not a directory; expected a directory path"),
        (blocker / "sub" / "c", True, r"cannot create --out .*a-file/sub/c: .*a-file is not a directory"),
        (existing, False, r"--out .*res already exists; pass --force to replace it"),
    ]:
        with pytest.raises(OutputError, match=message):
            check_out(out, force)
        with pytest.raises(OutputError, match=message):
            StagedDir(out, force)
    with pytest.raises(OutputError, match=r"^--results .*res already exists"):
        StagedDir(existing, flag="--results")
    assert _tree(tmp_path) == ["a-file", "res", "res/keep.txt"] and blocker.read_text() == "x"
    check_out(existing, force=True)  # an existing directory is fine with --force
    check_out(tmp_path / "new" / "deep", force=False)


def test_staged_dir_force_replaces_and_a_racing_out_is_kept(tmp_path):
    from recsvc.artifacts import StagedDir

    out = tmp_path / "res"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with StagedDir(out, force=True) as s:
        (s.tmp / "new.txt").write_text("new")
        assert (out / "old.txt").read_text() == "old"  # replaced only at publish
        s.publish()
    assert _tree(tmp_path) == ["res", "res/new.txt"]

    racing = tmp_path / "a" / "raced"
    with pytest.raises(OutputError, match=r"--out .*raced appeared while writing; not replacing it \(pass --force"):
        with StagedDir(racing) as s:
            (s.tmp / "ours.txt").write_text("ours")
            racing.mkdir()  # another process creates out meanwhile
            (racing / "theirs.txt").write_text("theirs")
            s.publish()
    assert _tree(tmp_path / "a") == ["raced", "raced/theirs.txt"]  # theirs kept, no temp dir, a/ kept (not empty)


def test_staged_dir_os_error_on_enter_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    import recsvc.artifacts as artifacts

    def denied(prefix, dir):
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}abc")

    out = tmp_path / "a" / "b" / "c"
    stage = artifacts.StagedDir(out)
    monkeypatch.setattr(artifacts.tempfile, "mkdtemp", denied)
    with pytest.raises(OutputError, match=r"^cannot create --out .*a/b/c: Permission denied \(.*a/b\)$"):
        stage.__enter__()
    assert list(tmp_path.iterdir()) == []  # a/ and a/b/ were made, then removed
    monkeypatch.undo()
    # A parent that became a file after the checks: the mkdir's error, nothing made.
    (tmp_path / "a").write_text("x")
    with pytest.raises(OutputError, match=r"cannot create --out .*a/b/c: Not a directory \(.*a/b\)"):
        with stage:
            pass
    assert _tree(tmp_path) == ["a"]


def test_artifact_writer_error_outside_with_and_after_commit(tmp_path):
    w = ArtifactWriter(tmp_path / "toy")
    with pytest.raises(RuntimeError, match="ArtifactWriter used outside its `with` block"):
        w.write_items(_items())
    assert list(tmp_path.iterdir()) == []


def test_publish_never_replaces_a_directory_that_appeared_at_the_last_moment(tmp_path, monkeypatch):
    """Between publish's check and the rename another process makes ``out`` (empty): without
    --force that directory is kept and the run gets the clear error, not a silent replace."""
    from recsvc import artifacts
    from recsvc.artifacts import OutputError, StagedDir

    out = tmp_path / "res"
    real = artifacts._renameat2

    def racing(a, b, flags):
        Path(b).mkdir(exist_ok=True)  # the other process wins the race
        return real(a, b, flags)

    with StagedDir(out) as stage:
        (stage.tmp / "mine.txt").write_text("new")
        monkeypatch.setattr(artifacts, "_renameat2", racing)
        with pytest.raises(OutputError, match=r"--out .*res appeared while writing; not replacing it"):
            stage.publish()
    assert out.is_dir() and list(out.iterdir()) == [] and list(tmp_path.iterdir()) == [out]
    # With --force the same race ends with our directory in place.
    with StagedDir(tmp_path / "res2", force=True) as stage:
        (stage.tmp / "mine.txt").write_text("new")
        stage.publish()
    assert (tmp_path / "res2" / "mine.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["res", "res2"]


def test_a_parent_made_meanwhile_by_another_run_is_used_and_kept(tmp_path, monkeypatch):
    from recsvc.artifacts import StagedDir

    out = tmp_path / "a" / "b" / "res"
    real_mkdir = Path.mkdir

    def racing_mkdir(self, *args, **kwargs):
        if self == tmp_path / "a":
            real_mkdir(self)  # the other run creates it first
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    with pytest.raises(RuntimeError):
        with StagedDir(out):
            raise RuntimeError("fails after the parents exist")
    monkeypatch.undo()
    assert (tmp_path / "a").is_dir() and not (tmp_path / "a" / "b").exists()  # ours removed, theirs kept
