"""The study framework (eval.study) on a tiny fake study: what it writes, what it refuses."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
import pytest

from eval.study import Output, SchemaError, Study, execute
from recsvc.checks import ParamError
from recsvc.settings import Range, setting
from recsvc.staging import OutputError


@dataclass(frozen=True)
class TinyConfig:
    out: Path | None = setting(None, unit="dir", help="results directory")
    n: int = setting(3, help="rows", check=Range(1, integer=True))
    force: bool = setting(False, help="replace an existing --out directory")


@dataclass
class TinyResult:
    config: TinyConfig
    table: pl.DataFrame
    out: Path | None = None


def _run(cfg: TinyConfig) -> TinyResult:
    return TinyResult(cfg, pl.DataFrame({"i": list(range(cfg.n)), "x": [0.5 * i for i in range(cfg.n)]}))


def _figures(result: TinyResult) -> dict:
    from eval.figures import pyplot

    fig, ax = pyplot().subplots(figsize=(2, 2), dpi=50)
    ax.plot(result.table["i"], result.table["x"])
    return {"tiny.png": fig}


def _validate(cfg: TinyConfig) -> TinyConfig:
    if cfg.n == 13:
        raise ParamError("{n} must not be 13")
    return cfg


TINY = Study(
    title="Tiny study",
    config=TinyConfig,
    run=_run,
    outputs=(
        Output("tiny.parquet", lambda r: r.table, {"i": pl.Int64, "x": pl.Float64}),
        Output("tiny.json", lambda r: {"rows": r.table.height, "sum": r.table["x"].sum()}, ("rows", "sum")),
        Output("skipped.csv", lambda r: None, {"never": pl.Int64}),
    ),
    report=lambda r: f"{r.table.height} rows.",
    plots=_figures,
    validate=_validate,
)


def test_outputs_figures_and_report_are_written_once_published(tmp_path: Path) -> None:
    out = tmp_path / "res"
    result = execute(TINY, TinyConfig(out=out, n=4))
    assert result.out == out and not list(tmp_path.glob(".res*"))  # the staging directory was renamed
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "tiny.json", "tiny.parquet", "tiny.png"]
    assert pl.read_parquet(out / "tiny.parquet").schema == {"i": pl.Int64, "x": pl.Float64}
    assert json.loads((out / "tiny.json").read_text()) == {"rows": 4, "sum": 3.0}
    assert (out / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    assert report.startswith("# Tiny study\n\n4 rows.\n\n## Figures\n\n![tiny.png](tiny.png)\n")
    assert "| n | 4 |" in report and "| out |" not in report and "| force |" not in report


def test_without_out_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert execute(TINY, TinyConfig(n=2)).table.height == 2
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_schema_is_refused_and_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "new" / "res"
    wrong = replace(TINY, outputs=(Output("tiny.csv", lambda r: r.table, {"i": pl.Int64, "x": pl.Int64}),))
    with pytest.raises(SchemaError, match=r"tiny\.csv has columns .*'x': Float64.*declares .*'x': Int64"):
        execute(wrong, TinyConfig(out=out))
    keys = replace(TINY, outputs=(Output("tiny.json", lambda r: {"rows": 1}, ("rows", "sum")),))
    with pytest.raises(SchemaError, match=r"tiny\.json has keys \['rows'\]; its study declares \['rows', 'sum'\]"):
        execute(keys, TinyConfig(out=out))
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_and_an_existing_out_are_refused_before_any_work(tmp_path: Path, snapshot) -> None:
    out = tmp_path / "res"
    out.mkdir()
    (out / "keep.txt").write_text("earlier")
    before = snapshot(tmp_path)
    with pytest.raises(ParamError, match=r"n must be an integer ≥ 1, got 0"):
        execute(TINY, TinyConfig(out=tmp_path / "other", n=0))
    with pytest.raises(ParamError, match=r"n must not be 13"):
        execute(TINY, TinyConfig(out=tmp_path / "other", n=13))
    with pytest.raises(OutputError, match="already exists"):
        execute(TINY, TinyConfig(out=out))
    assert snapshot(tmp_path) == before
    execute(TINY, TinyConfig(out=out, force=True))
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "tiny.json", "tiny.parquet", "tiny.png"]


def _streaming_run(cfg: TinyConfig, tmp: Path | None) -> TinyResult:
    """Writes part of its results into the staged directory while it runs (like the sweep)."""
    if tmp is not None:
        assert tmp.name.startswith(".res.tmp-") and not (tmp.parent / "res").exists()  # not published yet
        (tmp / "during.txt").write_text("written during the run")
    if cfg.n == 7:
        raise RuntimeError("failed after writing")
    return _run(cfg)


STREAMING = replace(TINY, run=_streaming_run, plots=lambda r: {}, streams=True)


def test_a_streaming_study_fills_the_staged_directory_while_it_runs(tmp_path: Path, snapshot) -> None:
    out = tmp_path / "res"
    result = execute(STREAMING, TinyConfig(out=out, n=4))
    assert result.out == out and not list(tmp_path.glob(".res*"))
    assert sorted(p.name for p in out.iterdir()) == ["during.txt", "report.md", "tiny.json", "tiny.parquet"]
    assert (out / "during.txt").read_text() == "written during the run"
    assert (out / "report.md").read_text().startswith("# Tiny study\n\n4 rows.\n\n## Settings\n")
    before = snapshot(tmp_path)
    with pytest.raises(RuntimeError, match="failed after writing"):  # nothing is left of a failed run
        execute(STREAMING, TinyConfig(out=tmp_path / "new" / "res", n=7))
    assert snapshot(tmp_path) == before and [p.name for p in tmp_path.iterdir()] == ["res"]
    assert execute(STREAMING, TinyConfig(n=2)).out is None  # without out: tmp is None, nothing is written
    assert snapshot(tmp_path) == before


def test_without_skeleton_the_report_is_the_study_s_own(tmp_path: Path) -> None:
    execute(replace(TINY, skeleton=False), TinyConfig(out=tmp_path / "res", n=4))
    assert (tmp_path / "res" / "report.md").read_text() == "4 rows."
