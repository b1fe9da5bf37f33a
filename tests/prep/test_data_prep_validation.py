"""`recsvc prep` input validation: every bad input is one clear line naming the flag, and it
fails before any directory is made, before the engine connects and before any data is loaded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import data_prep.pipeline as pipeline
from data_prep.datasets.base import DataError
from data_prep.datasets.synthetic import PRESETS, config_for
from data_prep.pipeline import PrepConfig, run
from recsvc.app.cli import main
from recsvc.checks import ParamError


@pytest.fixture
def no_work(monkeypatch):
    """Validation must fail before the engine connects or any data is loaded."""

    def forbidden(*a, **k):
        raise AssertionError("work started before the input was validated")

    monkeypatch.setattr(pipeline, "_connect", forbidden)
    monkeypatch.setattr(pipeline, "_load_and_split", forbidden)


SYN = ["--dataset", "synthetic", "--preset", "tiny"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "synthetic", "--preset", "huge"], r"unknown synthetic preset 'huge'; expected --preset one of"),
        ([*SYN, "--users", "-5"], r"--users must be ≥ 1, got -5"),
        ([*SYN, "--users", "0"], r"--users must be ≥ 1, got 0"),
        ([*SYN, "--items", "0"], r"--items must be ≥ 1, got 0"),
        ([*SYN, "--interactions", "0"], r"--interactions must be ≥ 1, got 0"),
        ([*SYN, "--items", "10"], r"needs --items ≥ 20, got 10"),
        ([*SYN, "--users", "3000"], r"expected --interactions ≥ 5 × --users = 15000"),
        ([*SYN, "--workers", "0"], r"--workers must be an integer ≥ 1, got 0$"),
        ([*SYN, "--chunk-users", "0"], r"--chunk-users must be an integer ≥ 1, got 0"),
        ([*SYN, "--seed", "-1"], r"--seed must be an integer ≥ 0, got -1"),
        ([*SYN, "--percentiles", "50", "50"], r"--percentiles must satisfy 0 ≤ lo < hi ≤ 100, got 50.0 50.0"),
        ([*SYN, "--l2", "-1"], r"--l2 must be one or more values, each a finite number > 0, got -1$"),
        (
            [*SYN, "--density", "2"],
            r"--density must be one or more values, each a finite number in \(0, 1\], got 2$",
        ),
        ([*SYN, "--val-users", "-1"], r"--val-users must be an integer ≥ 0, got -1$"),
        (
            ["--dataset", "ml-100k", "--preset", "tiny"],
            r"--preset only applies to --dataset synthetic, got --dataset ml-100k",
        ),
        (["--users", "10", "--items", "30"], r"--users, --items only apply to --dataset synthetic"),
        (["--population-users", "50"], r"--population-users only applies to --dataset amazon-book"),
        (
            [*SYN, "--population-users", "50"],
            r"--population-users only applies to --dataset amazon-book .*got --dataset synthetic",
        ),
        (["--dataset", "amazon-book", "--test-users", "5"], r"--test-users does not apply to --dataset amazon-book"),
        (
            ["--dataset", "amazon-book", "--sensitivity-population", "test"],
            r"--sensitivity-population does not apply to --dataset amazon-book",
        ),
        (
            [*SYN, "--engine", "local", "--scheduler", "tcp://127.0.0.1:8786"],
            r"--scheduler needs --engine dask .*got --engine local",
        ),
        (
            [*SYN, "--scheduler", "notaurl"],
            r"--scheduler 'notaurl' is not a Dask scheduler address .*expected e\.g\. tcp://HOST:8786",
        ),
        (
            [*SYN, "--scheduler", "foo://h:1"],
            r"--scheduler 'foo://h:1' is not a Dask scheduler address \(unknown protocol 'foo'\)",
        ),
    ],
)
def test_bad_flag_fails_before_any_work_or_directory(tmp_path: Path, no_work, args, message, prep_error_line) -> None:
    out = tmp_path / "np1" / "deep" / "o"
    assert main(["prep", *args, "--out", str(out)]) == 2
    assert re.search(message, prep_error_line())
    assert list(tmp_path.iterdir()) == []


def test_data_dir_that_is_a_file(tmp_path: Path, no_work, prep_error_line) -> None:
    f = tmp_path / "ratings.csv"
    f.write_text("x")
    assert main(["prep", "--dataset", "ml-20m", "--data-dir", str(f), "--out", str(tmp_path / "a" / "o")]) == 2
    assert re.search(r"--data-dir .*ratings\.csv is not a directory; expected a directory", prep_error_line())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ratings.csv"]
    assert main(["prep", *SYN, "--data-dir", str(tmp_path), "--out", str(tmp_path / "a" / "o")]) == 2
    assert "--data-dir does not apply to --dataset synthetic" in prep_error_line()


@pytest.mark.parametrize("where", ["under-a-file", "file-itself", "not-permitted"])
def test_unusable_out_is_one_line_and_creates_nothing(tmp_path: Path, where, prep_error_line) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out, message = {
        "under-a-file": (
            blocker / "sub" / "deeper",
            r"cannot create --out .*a-file/sub/deeper: .*a-file is not a directory",
        ),
        "file-itself": (blocker, r"cannot create --out .*a-file: it exists and is not a directory"),
        # sysfs refuses new entries even to root, unlike a chmod-ed directory.
        "not-permitted": (
            Path("/sys/recsvc-prep-test/o"),
            r"cannot create --out /sys/recsvc-prep-test/o: Operation not permitted \(/sys",
        ),
    }[where]
    assert main(["prep", *SYN, "--workers", "1", "--out", str(out)]) == 2
    assert re.search(message, prep_error_line())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and blocker.read_text() == "x"
    assert not Path("/sys/recsvc-prep-test").exists()


def test_failed_run_removes_the_parents_it_created(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "kept").mkdir()

    def bad_data(*a, **k):
        raise DataError("simulated bad data file")

    monkeypatch.setattr(pipeline, "_load_and_split", bad_data)
    with pytest.raises(DataError, match="simulated"):
        run(
            PrepConfig(
                dataset="synthetic", preset="tiny", out=tmp_path / "kept" / "new" / "o", workers=1, progress=False
            )
        )
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []


def test_unreachable_scheduler_fails_before_loading(tmp_path: Path, monkeypatch, prep_error_line) -> None:
    calls: list[str] = []

    class Unreachable:
        def map(self, *a, **k):
            calls.append("map")
            raise OSError("Timed out trying to connect to tcp://127.0.0.1:1 after 20 s")
            yield  # a generator, like the real engines

        def close(self) -> None:
            calls.append("close")

    def made(engine, workers, scheduler, progress=None):
        calls.append(f"{engine} {scheduler}")
        return Unreachable()

    def forbidden(*a, **k):
        raise AssertionError("loaded data before connecting to the scheduler")

    monkeypatch.setattr(pipeline, "make_engine", made)
    monkeypatch.setattr(pipeline, "_load_and_split", forbidden)
    cfg = PrepConfig(dataset="synthetic", preset="tiny", out=tmp_path / "a" / "o", scheduler="tcp://127.0.0.1:1")
    with pytest.raises(ParamError, match=r"^cannot connect to scheduler tcp://127\.0\.0\.1:1: Timed out"):
        run(cfg)
    assert calls == ["dask tcp://127.0.0.1:1", "map", "close"]
    assert list(tmp_path.iterdir()) == []
    calls.clear()
    assert main(["prep", *SYN, "--scheduler", "tcp://127.0.0.1:1", "--out", str(tmp_path / "a" / "o")]) == 2
    assert re.search(
        r"cannot connect to --scheduler tcp://127\.0\.0\.1:1: Timed out .*; expected a running Dask scheduler$",
        prep_error_line(),
    )
    assert calls == ["dask tcp://127.0.0.1:1", "map", "close"]
    assert list(tmp_path.iterdir()) == []


def test_synthetic_sizes_none_means_preset_zero_is_an_error() -> None:
    tiny = PRESETS["tiny"]
    assert config_for("tiny", None, None, None) == tiny
    got = config_for("tiny", 300, 100, 9000)
    assert (got.users, got.items, got.interactions, got.test_users) == (300, 100, 9000, tiny.test_users)
    for kw in ({"users": 0}, {"items": 0}, {"interactions": 0}):
        sizes = {"users": None, "items": None, "interactions": None, **kw}
        with pytest.raises(ParamError, match=rf"^{next(iter(kw))} must be ≥ 1, got 0$"):
            config_for("tiny", **sizes)


def test_defaults_resolve_when_flags_are_not_given() -> None:
    cfg = PrepConfig(dataset="synthetic")
    cfg.validate()
    assert cfg.preset_name() == "small" and cfg.engine_name() == "local"
    assert cfg.output_dir() == Path("artifacts/synthetic-small")
    assert PrepConfig(scheduler="tcp://127.0.0.1:8786").engine_name() == "dask"
    PrepConfig(dataset="amazon-book", population_users=5).validate()  # where it applies, it is accepted


@pytest.mark.parametrize(
    "out_rel, message",
    [
        (".", r"--out \. is the current directory; expected a separate output directory"),
        ("sub/..", r"--out sub/\.\. is the current directory"),
        ("sub/../..", r"--out sub/\.\./\.\. contains the (current|--data-dir) directory"),
        (
            "data",
            r"--out data is the --data-dir directory .*data; expected a separate output directory \(--data-dir is never replaced",
        ),
        ("data/art", r"--out data/art is inside the --data-dir directory"),
        ("work", r"--out work contains the --data-dir directory"),
    ],
)
def test_out_never_replaces_the_working_directory_or_the_input_data(
    tmp_path: Path, monkeypatch, no_work, out_rel, message, prep_error_line
) -> None:
    """--force replaces --out whole: it must never be the cwd, contain it, or overlap --data-dir."""
    cwd = tmp_path / "work" / "cwd"
    data = tmp_path / "work" / "data"
    cwd.mkdir(parents=True)
    data.mkdir()
    (cwd / "sub").mkdir()
    (cwd / "keep.txt").write_text("mine")
    (data / "ratings.csv").write_text("userId,movieId,rating,timestamp\n")
    monkeypatch.chdir(cwd)
    if out_rel.startswith("data"):
        out_rel = out_rel.replace("data", "../data", 1)
        message = message.replace("data", r"\.\./data", 1)
    elif out_rel == "work":
        out_rel, message = "../../work", message.replace("work", r"\.\./\.\./work", 1)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert (
        main(["prep", "--dataset", "ml-20m", "--data-dir", str(data), "--workers", "1", "--out", out_rel, "--force"])
        == 2
    )
    assert re.search(message, prep_error_line())
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert (cwd / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dataset": "nope"}, r"^dataset must be one of ml-100k, ml-20m, netflix, amazon-book, synthetic, got 'nope'$"),
        ({"workers": 0}, r"^workers must be an integer ≥ 1, got 0$"),
        ({"seed": -1}, r"^seed must be an integer ≥ 0, got -1$"),
        ({"percentiles": (50.0, 50.0)}, r"^percentiles must satisfy 0 ≤ lo < hi ≤ 100, got 50\.0 50\.0$"),
        ({"l2": (-1.0,)}, r"^l2 must be one or more values, each a finite number > 0, got -1$"),
        ({"dataset": "ml-100k", "preset": "tiny"}, r"^preset only applies to dataset synthetic, got dataset ml-100k$"),
        (
            {"dataset": "ml-100k", "preset": None, "users": 10, "items": 30},
            r"^users, items only apply to dataset synthetic",
        ),
        (
            {"dataset": "amazon-book", "preset": None, "test_users": 5},
            r"^test_users does not apply to dataset amazon-book ",
        ),
        (
            {"engine": "local", "scheduler": "tcp://127.0.0.1:8786"},
            r"^scheduler needs engine dask \(or no engine\), got engine local$",
        ),
        ({"scheduler": "notaurl"}, r"^scheduler 'notaurl' is not a Dask scheduler address "),
        (
            {"users": 3000},
            r"^synthetic sizes users 3000 interactions 12000 are unusable; expected interactions ≥ 5 × users = 15000$",
        ),
    ],
)
def test_library_errors_name_the_parameters(fields: dict, message: str) -> None:
    """PrepConfig words its errors with its field names; `recsvc prep` shows them as flags (above)."""
    cfg = PrepConfig(**{"dataset": "synthetic", "preset": "tiny", **fields})
    with pytest.raises(ParamError, match=message):
        cfg.validate()


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("amazon-book", r"amazon-book needs DATA_DIR: a directory containing LightGCN train\.txt and test\.txt$"),
        ("netflix", r"netflix needs DATA_DIR: a directory containing combined_data_1\.txt, "),
        ("ml-20m", r"ml-20m needs DATA_DIR: a directory containing ratings\.csv"),
    ],
)
def test_a_dataset_without_its_data_dir_names_it(dataset: str, message: str, tmp_path: Path, prep_error_line) -> None:
    from data_prep.datasets import load

    with pytest.raises(ParamError, match="^" + message.replace("DATA_DIR", "data_dir")):
        load(dataset, None)
    assert main(["prep", "--dataset", dataset, "--workers", "1", "--out", str(tmp_path / "o")]) == 2
    assert re.search(message.replace("DATA_DIR", "--data-dir"), prep_error_line())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"factorizer": "nope"}, r"^factorizer must be one of cholmod, icf, got 'nope'$"),
        ({"engine": "nope"}, r"^engine must be one of local, dask, got 'nope'$"),
        (
            {"sensitivity_population": "nope"},
            r"^sensitivity_population must be one of validation, test, got 'nope'$",
        ),
        ({"density": ()}, r"^density must be one or more values, each a finite number in \(0, 1\], got no values$"),
        (
            {"dataset": "ml-20m", "preset": None, "data_dir": Path("/nonexistent-recsvc")},
            r"^data_dir /nonexistent-recsvc does not exist; expected a directory with the dataset's files$",
        ),
    ],
)
def test_more_library_errors_name_the_parameters(fields: dict, message: str) -> None:
    with pytest.raises(ParamError, match=message):
        PrepConfig(**{"dataset": "synthetic", "preset": "tiny", **fields}).validate()


def test_a_grid_without_validation_users_names_the_parameters(tmp_path: Path, prep_error_line) -> None:
    """A check that needs the split: the library names the fields, `recsvc prep` the flags."""
    argv = ["prep", *SYN, "--workers", "1", "--out", str(tmp_path / "o"), "--val-users", "0", "--l2", "1", "2"]
    assert main(argv) == 2
    assert re.search(
        r"choosing l2/density needs validation users; give one --l2 and one --density value$", prep_error_line()
    )
    assert list(tmp_path.iterdir()) == []
    cfg = PrepConfig(
        dataset="synthetic", preset="tiny", workers=1, out=tmp_path / "o", progress=False, val_users=0, l2=(1.0, 2.0)
    )
    with pytest.raises(
        ParamError, match=r"^choosing l2/density needs validation users; give one l2 and one density value$"
    ):
        run(cfg)
    assert list(tmp_path.iterdir()) == []
