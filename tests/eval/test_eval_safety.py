"""Bad input to `recsvc eval` / `eval-synthetic` / `demo` is refused and changes nothing:
no replaced directory, no hidden temp dir, no half-built artifact."""

from dataclasses import replace

import polars as pl
import pytest

from eval.evaluation import aggregate, outputs
from eval.evaluation.config import EvalConfig, chunk_size, validate
from eval.evaluation.run import run
from eval.testing import make_artifact
from recsvc.app import demo
from recsvc.app.cli import main as recsvc_main
from recsvc.artifact import load_artifact
from recsvc.checks import ParamError
from recsvc.staging import OutputError

QUICK = ["--users", "3", "--trials", "2", "--epsilons", "1", "--mechanisms", "rnm", "gem", "--workers", "1"]


@pytest.fixture()
def art(tmp_path):
    return make_artifact(tmp_path / "art", users=6, n=8)


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
@pytest.mark.parametrize("force", [False, True])
def test_out_overlapping_the_artifact_is_refused_even_with_force(where, force, art, tmp_path, snapshot, one_line_error):
    out = {"same": art, "inside": art / "results", "parent": tmp_path}[where]
    before = snapshot(tmp_path)
    argv = ["eval", "--artifacts", str(art), "--out", str(out), *QUICK] + (["--force"] if force else [])
    assert recsvc_main(argv) == 2
    one_line_error(r"--out .* (is|is inside|contains) the --artifacts directory")
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["art"]
    assert load_artifact(art).manifest.files  # still a valid, verified artifact


@pytest.mark.parametrize("cmd", [["eval", "--artifacts", "{art}"], ["eval-synthetic", "--scenario", "4", "--n", "8"]])
def test_existing_out_needs_force(cmd, art, tmp_path, one_line_error):
    out = tmp_path / "res"
    out.mkdir()
    (out / "keep.txt").write_text("earlier results")
    argv = [a.format(art=art) for a in cmd] + ["--out", str(out), *QUICK]
    assert recsvc_main(argv) == 2
    one_line_error(r"--out .*res already exists; pass --force to replace it")
    assert (out / "keep.txt").read_text() == "earlier results" and len(list(tmp_path.glob(".res*"))) == 0
    assert recsvc_main([*argv, "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "report.md").stat().st_size > 0
    assert pl.read_parquet(out / "users.parquet").height == 3 and not list(tmp_path.glob(".res*"))


@pytest.mark.parametrize("force", [False, True])
def test_out_that_is_a_file_is_refused(force, art, tmp_path, one_line_error):
    out = tmp_path / "res.txt"
    out.write_text("not a directory")
    argv = ["eval", "--artifacts", str(art), "--out", str(out), *QUICK] + (["--force"] if force else [])
    assert recsvc_main(argv) == 2
    one_line_error(r"cannot create --out .*res\.txt: it exists and is not a directory; expected a directory path")
    assert out.read_text() == "not a directory" and not list(tmp_path.glob(".res*"))


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--workers", "-2"], r"--workers must be an integer ≥ 1, got -2"),
        (["--workers", "0"], r"--workers must be an integer ≥ 1, got 0"),
        (["--chunk-size", "0"], r"--chunk-size must be an integer ≥ 1, got 0"),
        (["--ratio-epsilon", "-1"], r"--ratio-epsilon must be a finite number > 0, got -1"),
        (["--ratio-epsilon", "0"], r"--ratio-epsilon must be a finite number > 0, got 0"),
        (["--ratio-epsilon", "nan"], r"--ratio-epsilon must be a finite number > 0, got nan"),
        (["--engine", "dask", "--workers", "0"], r"--workers must be an integer ≥ 1"),
    ],
)
def test_refused_run_leaves_no_temp_dir(extra, match, art, tmp_path, one_line_error):
    out = tmp_path / "results"
    # QUICK's --workers 1 comes first; a later --workers overrides it (argparse keeps the last).
    assert recsvc_main(["eval", "--artifacts", str(art), "--out", str(out), *QUICK, *extra]) == 2
    one_line_error(match)
    assert not out.exists() and not list(tmp_path.glob(".results*"))


def test_out_appearing_during_the_run_is_not_replaced(art, tmp_path, monkeypatch):
    out = tmp_path / "res"
    write = outputs.write_summary

    def racing_write(result, tmp):  # another process creates --out while we evaluate
        out.mkdir()
        (out / "theirs.txt").write_text("x")
        write(result, tmp)

    monkeypatch.setattr(outputs, "write_summary", racing_write)
    with pytest.raises(ValueError, match="appeared while writing; not replacing it"):
        run(
            EvalConfig(
                artifacts=art,
                out=out,
                users=2,
                trials=1,
                epsilons=(1.0,),
                mechanisms=("rnm",),
                workers=1,
                progress=False,
            )
        )
    assert [p.name for p in out.iterdir()] == ["theirs.txt"] and not list(tmp_path.glob(".res.tmp-*"))


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_failed_run_leaves_no_parents_or_temp_dir_and_a_good_run_publishes(error, art, tmp_path, monkeypatch):
    out = tmp_path / "a" / "b" / "c"  # a/ does not exist yet
    cfg = EvalConfig(
        artifacts=art, out=out, users=3, trials=2, epsilons=(1.0,), mechanisms=("rnm", "gem"), workers=1, progress=False
    )
    finish = aggregate.finish

    def failing_finish(*a, **k):  # fails after every chunk's rows were streamed into the temp dir
        finish(*a, **k)
        raise error("boom after evaluating")

    monkeypatch.setattr(aggregate, "finish", failing_finish)
    with pytest.raises(error, match="boom"):
        run(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
    monkeypatch.undo()
    assert run(cfg).out == out and pl.read_parquet(out / "users.parquet").height == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["c"]  # published, no temp sibling
    (out / "mine.txt").write_text("x")
    with pytest.raises(OutputError, match=r"^out .*c already exists; pass force to replace it$"):
        run(cfg)
    assert (out / "mine.txt").read_text() == "x"
    assert run(replace(cfg, force=True, users=2)).users == 2  # --force replaces
    assert not (out / "mine.txt").exists() and pl.read_parquet(out / "users.parquet").height == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["c"]


def test_level_only_with_the_sweep_scenario(tmp_path, one_line_error):
    out = tmp_path / "s1"
    argv = ["eval-synthetic", "--scenario", "1", "--n", "8", "--out", str(out), *QUICK]
    assert recsvc_main([*argv, "--level", "3"]) == 2
    one_line_error(r"--level applies only to --scenario sweep, got it with --scenario 1")
    assert not out.exists()
    assert recsvc_main(argv) == 0  # without --level the other scenarios still work
    # sweep: default level 0.8, an explicit level changes the data (and the default out name).
    kw = dict(
        scenario="sweep", n=10, users=30, trials=2, epsilons=(1.0,), mechanisms=("rnm",), workers=1, progress=False
    )
    default, low = run(EvalConfig(**kw)), run(EvalConfig(**kw, level=-0.8))
    assert default.dataset == "scenario-sweep-t0.8" and low.dataset == "scenario-sweep-t-0.8"
    assert default.correlation["spearman"]["mean"] > 0 > low.correlation["spearman"]["mean"]


def test_auto_chunk_size_gives_each_worker_several_chunks_and_same_per_user_results(tmp_path):
    cfg = EvalConfig(scenario="4", workers=2)
    assert chunk_size(cfg, 100) == 16  # 7 chunks, not 1 (never below 16 users)
    assert chunk_size(cfg, 160) == 20  # 4 chunks per worker
    assert chunk_size(cfg, 100_000) == 256
    assert chunk_size(EvalConfig(scenario="4", workers=1), 100) == 25
    assert chunk_size(EvalConfig(scenario="4", workers=2, chunk_size=256), 100) == 256  # explicit wins
    kw = dict(
        scenario="4", n=12, users=100, trials=3, epsilons=(0.5,), mechanisms=("rnm", "mgem"), workers=1, progress=False
    )
    auto = run(EvalConfig(**kw, out=tmp_path / "auto"))
    one = run(EvalConfig(**kw, chunk_size=256, out=tmp_path / "one"))
    assert auto.config.chunk_size == 25 and one.config.chunk_size == 256  # recorded in summary.json
    for name in ("selections", "users"):
        assert pl.read_parquet(tmp_path / "auto" / f"{name}.parquet").equals(
            pl.read_parquet(tmp_path / "one" / f"{name}.parquet")
        ), name


# ---------------------------------------------------------------------------------------------
# recsvc demo


def _no_stage_1(*_a, **_k):
    raise AssertionError("stage 1 ran before the arguments were checked")


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--trials", "0"], r"--trials must be an integer ≥ 1, got 0"),
        (["--users", "0"], r"--users must be an integer ≥ 1, got 0"),
        (["--results", "{art}"], r"--results .* is the --artifacts directory"),
        (["--results", "{art}/x", "--force"], r"--results .* is inside the --artifacts directory"),
    ],
)
def test_demo_checks_arguments_before_stage_1(extra, match, tmp_path, monkeypatch, capsys, one_line_error):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "_prep", _no_stage_1)
    art = tmp_path / "art"
    assert recsvc_main(["demo", "--artifacts", str(art), *[a.format(art=art) for a in extra]]) == 2
    one_line_error(match)
    assert "1/3" not in capsys.readouterr().out and list(tmp_path.iterdir()) == []


def test_demo_replaces_its_own_results_but_not_a_named_directory(art, tmp_path, monkeypatch, one_line_error):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "_prep", lambda *a: None)  # the toy artifact stands in for ml-100k
    monkeypatch.setattr(demo, "_serve_and_select", lambda *a: None)
    argv = ["demo", "--artifacts", str(art), "--trials", "2", "--users", "3"]
    for _ in range(2):  # scripts/demo.sh is run again and again
        assert recsvc_main(argv) == 0
        assert pl.read_parquet(tmp_path / demo.DEFAULT_RESULTS / "users.parquet").height == 3
    named = tmp_path / "mine"
    named.mkdir()
    assert recsvc_main([*argv, "--results", str(named)]) == 2
    one_line_error(r"--results .*mine already exists; pass --force to replace it")
    assert list(named.iterdir()) == []
    assert recsvc_main([*argv, "--results", str(named), "--force"]) == 0
    assert (named / "report.md").is_file()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"scenario": None}, r"^give exactly one data source: artifacts DIR or scenario NAME$"),
        (
            {"level": 3.0},
            r"^level applies only to scenario sweep, got it with scenario 1; drop level or use scenario sweep$",
        ),
        ({"trials": 0}, r"^trials must be an integer ≥ 1, got 0$"),
        ({"users": 0}, r"^users must be an integer ≥ 1, got 0$"),
        ({"chunk_size": 0}, r"^chunk_size must be an integer ≥ 1, got 0$"),
        ({"seed": -1}, r"^seed must be an integer ≥ 0, got -1$"),
        ({"workers": 0}, r"^workers must be an integer ≥ 1, got 0$"),
        ({"ratio_epsilon": float("nan")}, r"^ratio_epsilon must be a finite number > 0, got nan$"),
    ],
)
def test_library_errors_name_the_parameters(fields, message):
    """EvalConfig words its errors with its field names; `recsvc eval` shows them as flags (above)."""
    with pytest.raises(ParamError, match=message):
        validate(EvalConfig(**{"scenario": "1", **fields}))
