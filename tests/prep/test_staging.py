"""recsvc.staging: the one way every part stages and publishes an output directory. Messages
name parameters (``out``, ``force``, the protected inputs); the CLI tests check the flags."""

import re
from pathlib import Path

import pytest

import recsvc.staging as staging
from recsvc.checks import ParamError
from recsvc.staging import OutputError, StagedDir, check_out


def _dir_with(path, text):
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def test_replace_dir_exchanges_atomically_and_leaves_no_leftovers(tmp_path, monkeypatch):
    exchanges = []
    real_exchange = staging._exchange
    monkeypatch.setattr(staging, "_exchange", lambda a, b: exchanges.append((a, b)) or real_exchange(a, b))
    out = _dir_with(tmp_path / "out", "old")
    assert staging.replace_dir(_dir_with(tmp_path / ".new", "new"), out) == out
    assert exchanges == [(tmp_path / ".new", out)]  # one renameat2(RENAME_EXCHANGE), no window without `out`
    assert (out / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert staging.replace_dir(_dir_with(tmp_path / ".fresh", "x"), tmp_path / "other") == tmp_path / "other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out"]


def test_replace_dir_fallback_restores_the_old_directory_on_failure(tmp_path, monkeypatch):
    import errno
    import os

    def no_exchange(a, b):
        raise OSError(errno.ENOSYS, "no renameat2")

    monkeypatch.setattr(staging, "_exchange", no_exchange)
    out = _dir_with(tmp_path / "out", "old")
    staging.replace_dir(_dir_with(tmp_path / ".new", "new"), out)  # the two-rename fallback works
    assert (out / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    real_replace, calls = os.replace, []

    def failing_second_replace(a, b):
        calls.append(a)
        if len(calls) == 2:
            raise OSError(errno.EIO, "disk error")
        return real_replace(a, b)

    monkeypatch.setattr(staging.os, "replace", failing_second_replace)
    with pytest.raises(OSError, match="disk error"):
        staging.replace_dir(_dir_with(tmp_path / ".newer", "newer"), out)
    assert (out / "f.txt").read_text() == "new"  # the old directory is back in place


# ---------------------------------------------------------------------------------------------
# StagedDir: the one way every part stages and publishes an output directory


def _tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_staged_dir_publishes_into_new_parents(tmp_path):
    out = tmp_path / "a" / "b" / "c"
    with StagedDir(out) as s:
        assert s.tmp.parent == out.parent and s.tmp.name.startswith(".c.tmp-") and not out.exists()
        (s.tmp / "f.txt").write_text("new")
        assert s.publish() == out
    assert _tree(tmp_path) == ["a", "a/b", "a/b/c", "a/b/c/f.txt"] and (out / "f.txt").read_text() == "new"


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_staged_dir_failure_removes_temp_and_the_parents_it_made_only(tmp_path, error):
    (tmp_path / "keep").mkdir()
    with pytest.raises(error), StagedDir(tmp_path / "keep" / "new" / "deeper" / "c") as s:
        (s.tmp / "half.txt").write_text("half")
        (tmp_path / "keep" / "new" / "theirs.txt").write_text("x")  # someone else writes into a new parent
        raise error("crash mid-write")
    # deeper/ (empty) went; new/ holds another file, so it stays; keep/ existed before.
    assert _tree(tmp_path) == ["keep", "keep/new", "keep/new/theirs.txt"]
    with pytest.raises(error), StagedDir(tmp_path / "x" / "y" / "c"):
        raise error("crash")
    assert _tree(tmp_path) == ["keep", "keep/new", "keep/new/theirs.txt"]


def test_staged_dir_checks_create_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    existing = tmp_path / "res"
    existing.mkdir()
    (existing / "keep.txt").write_text("earlier")
    for out, force, message in [
        (blocker, True, r"cannot create out .*a-file: it exists and is not a directory; expected a directory path"),
        (blocker / "sub" / "c", True, r"cannot create out .*a-file/sub/c: .*a-file is not a directory"),
        (existing, False, r"^out .*res already exists; pass force to replace it$"),
    ]:
        with pytest.raises(OutputError, match=message):
            check_out(out, force)
        with pytest.raises(OutputError, match=message):
            StagedDir(out, force)
    with pytest.raises(OutputError, match=r"^results .*res already exists") as raised:
        StagedDir(existing, param="results")
    # The parameters stay names until a command line renders them as its flags.
    assert raised.value.params == ("results", "force")
    assert re.fullmatch(
        r"--results .*res already exists; pass --force to replace it",
        raised.value.render({"results": "--results", "force": "--force"}),
    )
    assert _tree(tmp_path) == ["a-file", "res", "res/keep.txt"] and blocker.read_text() == "x"
    check_out(existing, force=True)  # an existing directory is fine with --force
    check_out(tmp_path / "new" / "deep", force=False)


def test_staged_dir_force_replaces_and_a_racing_out_is_kept(tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with StagedDir(out, force=True) as s:
        (s.tmp / "new.txt").write_text("new")
        assert (out / "old.txt").read_text() == "old"  # replaced only at publish
        s.publish()
    assert _tree(tmp_path) == ["res", "res/new.txt"]

    racing = tmp_path / "a" / "raced"
    with pytest.raises(OutputError, match=r"^out .*raced appeared while writing; not replacing it \(pass force"):
        with StagedDir(racing) as s:
            (s.tmp / "ours.txt").write_text("ours")
            racing.mkdir()  # another process creates out meanwhile
            (racing / "theirs.txt").write_text("theirs")
            s.publish()
    assert _tree(tmp_path / "a") == ["raced", "raced/theirs.txt"]  # theirs kept, no temp dir, a/ kept (not empty)


def test_staged_dir_os_error_on_enter_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    real_mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if ".tmp-" in self.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    out = tmp_path / "a" / "b" / "c"
    stage = staging.StagedDir(out)
    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(OutputError, match=r"^cannot create out .*a/b/c: Permission denied \(.*a/b\)$"):
        stage.__enter__()
    assert list(tmp_path.iterdir()) == []  # a/ and a/b/ were made, then removed
    monkeypatch.undo()
    # A parent that became a file after the checks: the mkdir's error, nothing made.
    (tmp_path / "a").write_text("x")
    with pytest.raises(OutputError, match=r"cannot create out .*a/b/c: Not a directory \(.*a/b\)"), stage:
        pass
    assert _tree(tmp_path) == ["a"]


def test_publish_never_replaces_a_directory_that_appeared_at_the_last_moment(tmp_path, monkeypatch):
    """Between publish's check and the rename another process makes ``out`` (empty): without
    --force that directory is kept and the run gets the clear error, not a silent replace."""

    out = tmp_path / "res"
    real = staging._renameat2

    def racing(a, b, flags):
        Path(b).mkdir(exist_ok=True)  # the other process wins the race
        return real(a, b, flags)

    with StagedDir(out) as stage:
        (stage.tmp / "mine.txt").write_text("new")
        monkeypatch.setattr(staging, "_renameat2", racing)
        with pytest.raises(OutputError, match=r"^out .*res appeared while writing; not replacing it"):
            stage.publish()
    assert out.is_dir() and list(out.iterdir()) == [] and list(tmp_path.iterdir()) == [out]
    # With --force the same race ends with our directory in place.
    with StagedDir(tmp_path / "res2", force=True) as stage:
        (stage.tmp / "mine.txt").write_text("new")
        stage.publish()
    assert (tmp_path / "res2" / "mine.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [
        "res",
        "res2",
    ]


def test_a_parent_made_meanwhile_by_another_run_is_used_and_kept(tmp_path, monkeypatch):
    out = tmp_path / "a" / "b" / "res"
    real_mkdir = Path.mkdir

    def racing_mkdir(self, *args, **kwargs):
        if self == tmp_path / "a":
            real_mkdir(self)  # the other run creates it first
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    with pytest.raises(RuntimeError), StagedDir(out):
        raise RuntimeError("fails after the parents exist")
    monkeypatch.undo()
    assert (tmp_path / "a").is_dir() and not (tmp_path / "a" / "b").exists()  # ours removed, theirs kept


@pytest.mark.parametrize("rel, relation", [(".", "is"), ("inside", "is inside"), ("..", "contains")])
def test_overlap_with_a_protected_input_names_both_parameters(tmp_path, monkeypatch, rel, relation):
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    out = data / rel
    with pytest.raises(OutputError) as raised:
        check_out(out, force=True, protect={"data_dir": data})
    exc = raised.value
    assert isinstance(exc, ParamError) and isinstance(exc, ValueError)
    assert str(exc) == (
        f"out {out} {relation} the data_dir directory {data}; expected a separate output "
        "directory (data_dir is never replaced, not even with force)"
    )
    assert exc.render({"out": "--out", "data_dir": "--data-dir", "force": "--force"}) == (
        f"--out {out} {relation} the --data-dir directory {data}; expected a separate output "
        "directory (--data-dir is never replaced, not even with --force)"
    )


def test_the_current_directory_is_never_an_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match=r"^out \. is the current directory; expected a separate output"):
        check_out(".", force=True)
    with pytest.raises(OutputError, match=r"^results \.\. contains the current directory"):
        StagedDir("..", force=True, param="results")


def test_an_interrupt_while_entering_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM (here a KeyboardInterrupt, also a BaseException) that lands just after the temp
    dir is made: `with` never calls __exit__, so __enter__ removes the temp dir and the parents."""
    real_mkdir = Path.mkdir

    def mkdir_then_interrupt(self: Path, *args: object, **kwargs: object) -> None:
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]  # Path.mkdir's own arguments
        if ".tmp-" in self.name:
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "mkdir", mkdir_then_interrupt)
    with pytest.raises(KeyboardInterrupt), StagedDir(tmp_path / "a" / "b" / "out"):
        pass
    assert list(tmp_path.iterdir()) == []
