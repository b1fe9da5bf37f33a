"""`recsvc eval-synthetic --scenario sweep --level all`: the paper's Figure 10 in one results directory."""

import contextlib
import io
import json
import re
import struct

import numpy as np
import polars as pl
import pytest

from eval.evaluation import plots
from eval.evaluation import report as report_module
from eval.evaluation import run as runner
from eval.evaluation.config import DEFAULT_EPSILONS, EvalConfig, level_dirname
from eval.scenarios import SWEEP_LEVELS
from eval.scenarios.sweep import run_sweep
from eval.testing import unrendered_figures
from recsvc.app.cli import main as recsvc_main

MECHS = ["rnm", "gem", "mgem", "rs"]
EPS = [0.5, 2.0]
FLAGS = [
    "--n",
    "30",
    "--exact",
    "--epsilons",
    *map(str, EPS),
    "--mechanisms",
    *MECHS,
    "--trials",
    "5",
    "--workers",
    "1",
    "--seed",
    "3",
]
QUICK = ["--n", "10", "--epsilons", "1", "--mechanisms", "rnm", "gem", "--trials", "2", "--workers", "1"]
DIRS = ["t-5", "t-0.8", "t-0.3", "t0", "t0.3", "t0.8", "t5"]


@pytest.fixture
def unrendered(monkeypatch):
    """No figure is rendered: the levels' (:func:`eval.testing.unrendered_figures`: these tests check
    which files a sweep writes; rendered figures are checked by test_report_figure_and_terminal_summary
    (sweep.png), test_plots_survive_an_all_zero_mse and tests/eval/test_eval_harness.py (a level's)),
    and sweep.png is an empty file."""
    unrendered_figures(monkeypatch)
    monkeypatch.setattr(plots, "sweep_figure", lambda result, path: path.write_bytes(b""))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sw"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.MonkeyPatch.context() as mp:
        unrendered_figures(mp)
        assert recsvc_main(["eval-synthetic", "--scenario", "sweep", "--level", "all", "--out", str(out), *FLAGS]) == 0
    return out, stdout.getvalue()


def test_writes_every_level_and_the_sweep_table(sweep):
    out, _ = sweep
    assert [level_dirname(t) for t in SWEEP_LEVELS] == DIRS
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.md", "sweep.csv", "sweep.parquet", "sweep.png", *DIRS]
    )
    assert not list(out.parent.glob(".sw*"))  # no temp sibling left
    for d in DIRS:
        assert (out / d / "report.md").stat().st_size > 0 and pl.read_csv(out / d / "mse.csv").height == 8
        # each level records where it is published, not the staging directory it was written in
        assert json.loads((out / d / "summary.json").read_text())["config"]["out"] == str(out / d)
    table = pl.read_csv(out / "sweep.csv")
    assert table.columns == ["level", "spearman", "mechanism", "epsilon", "mse", "mse_rel_rnm", "method"]
    assert table.height == 7 * len(MECHS) * len(EPS)
    assert pl.read_parquet(out / "sweep.parquet").equals(table)
    assert table["level"].unique(maintain_order=True).to_list() == list(SWEEP_LEVELS)
    rnm = table.filter(pl.col("mechanism") == "rnm")
    assert rnm["mse_rel_rnm"].to_list() == [1.0] * 14 and (rnm["mse"] > 0).all()
    assert set(table.filter(pl.col("mechanism") == "rs")["method"]) == {"monte-carlo"}
    assert set(table.filter(pl.col("mechanism") != "rs")["method"]) == {"exact"}
    # The ratio is each level's own mse ÷ its rnm mse at the same ε.
    for t, d in zip(SWEEP_LEVELS, DIRS, strict=False):
        mse = pl.read_csv(out / d / "mse.csv")
        for eps in EPS:
            at = lambda df, m, col, eps=eps: df.filter((pl.col("mechanism") == m) & (pl.col("epsilon") == eps))[col][0]  # noqa: E731  # a one-line lookup, local to this loop
            row = table.filter((pl.col("level") == t) & (pl.col("epsilon") == eps))
            for m in MECHS:
                assert at(row, m, "mse") == at(mse, m, "mse_mean")
                assert at(row, m, "mse_rel_rnm") == pytest.approx(
                    at(mse, m, "mse_mean") / at(mse, "rnm", "mse_mean"), rel=1e-15
                )


def test_spearman_rises_over_the_levels_and_the_paper_finding_holds(sweep):
    out, _ = sweep
    table = pl.read_csv(out / "sweep.csv")
    rho = table.group_by("level", maintain_order=True).agg(pl.col("spearman").first())
    r = rho["spearman"].to_numpy()
    assert np.all(np.diff(r) > 0) and r[0] < -0.9 and r[-1] > 0.9, r
    # the median of the per-instance ρ each level's run measured
    for d, s in zip(DIRS, r, strict=True):
        users = pl.read_parquet(out / d / "users.parquet")
        assert users.height == 100 and float(np.median(users["spearman"].to_numpy())) == pytest.approx(s, abs=1e-12)
    rel = {(row["level"], row["mechanism"], row["epsilon"]): row["mse_rel_rnm"] for row in table.iter_rows(named=True)}
    for eps in EPS:  # Figure 10: GEM wins at strong negative correlation, mGEM at strong positive
        assert rel[(-5.0, "gem", eps)] < 0.1 < 1 < rel[(-5.0, "mgem", eps)]
        assert rel[(5.0, "mgem", eps)] < 0.6 and rel[(5.0, "gem", eps)] > 2


def test_report_figure_and_terminal_summary(sweep):
    out, text = sweep
    report = (out / "report.md").read_text()
    assert "![sweep](sweep.png)" in report and "ε=0.5 | ε=2" in report
    for t, d in zip(SWEEP_LEVELS, DIRS, strict=False):
        assert f"[t = {t:g}]({d}/report.md)" in report
    assert re.search(r"\| \[5\]\(t5/report\.md\) \| 0\.9\d\d \| mgem 0\.\d+ \| mgem 0\.\d+ \|", report), report
    # With many ε the table shows five, spread over the grid, always with the summary's ε = 1.
    assert report_module._table_epsilons(DEFAULT_EPSILONS) == [0.01, 0.05, 1.0, 4.0, 16.0]
    png = (out / "sweep.png").read_bytes()
    width, height = struct.unpack(">II", png[16:24])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and width > 1500 and height > 500
    lines = text.splitlines()
    assert lines[0].startswith("sweep: 7 levels × 4 mechanisms × 2 ε") and "best mechanism at ε=2" in lines[0]
    level_lines = [ln for ln in lines if ln.startswith("  t=")]
    assert len(level_lines) == 7 and "ρ=-0.9" in level_lines[0] and "gem" in level_lines[0]
    assert level_lines[-1].split()[-2] == "mgem" and lines[-1] == f"report: {out / 'report.md'}"


def test_a_level_equals_the_single_run_with_the_same_flags(sweep, tmp_path, unrendered):
    out, _ = sweep
    single = tmp_path / "single"
    argv = ["eval-synthetic", "--scenario", "sweep", "--level", "0.3", "--out", str(single), *FLAGS]
    assert recsvc_main(argv) == 0
    assert pl.read_csv(single / "mse.csv").equals(pl.read_csv(out / "t0.3" / "mse.csv"))
    assert pl.read_parquet(single / "selections.parquet").equals(pl.read_parquet(out / "t0.3" / "selections.parquet"))
    rows = pl.read_csv(out / "sweep.csv").filter(pl.col("level") == 0.3)
    assert rows["mse"].to_list() == pl.read_csv(single / "mse.csv")["mse_mean"].to_list()


def test_existing_out_needs_force(tmp_path, one_line_error, unrendered):
    out = tmp_path / "sw"
    out.mkdir()
    (out / "keep.txt").write_text("earlier results")
    argv = ["eval-synthetic", "--scenario", "sweep", "--level", "all", "--out", str(out), *QUICK]
    assert recsvc_main(argv) == 2
    one_line_error(r"--out .*sw already exists; pass --force to replace it")
    assert [p.name for p in tmp_path.iterdir()] == ["sw"] and (out / "keep.txt").read_text() == "earlier results"
    assert recsvc_main([*argv, "--force"]) == 0
    assert not (out / "keep.txt").exists() and sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(DIRS)
    assert [p.name for p in tmp_path.iterdir()] == ["sw"]


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--scenario", "4", "--level", "all"], r"--level applies only to --scenario sweep, got it with --scenario 4"),
        (["--scenario", "sweep", "--level", "abc"], r"--level must be a number or 'all', got 'abc'"),
        (["--scenario", "sweep", "--level", "all", "--trials", "0"], r"--trials must be an integer ≥ 1, got 0"),
        (["--scenario", "sweep", "--level", "all", "--n", "1"], r"scenario needs an integer n ≥ 2 candidates, got 1"),
        # --repeats is an alias of --users: the error names the flag that the help lists first
        (["--scenario", "sweep", "--level", "all", "--repeats", "0"], r"--users must be an integer ≥ 1, got 0"),
    ],
)
def test_bad_flags_are_refused_before_any_level_runs(extra, match, tmp_path, monkeypatch, one_line_error):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "evaluate", lambda *a, **k: pytest.fail("a level ran before the flags were checked"))
    # --n 10 from QUICK comes first; a later --n overrides it (argparse keeps the last).
    assert recsvc_main(["eval-synthetic", *QUICK, *extra]) == 2
    one_line_error(match)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [False, True])
def test_failure_mid_run_leaves_nothing_behind(error, existing, tmp_path, monkeypatch, snapshot, unrendered):
    out = tmp_path / "sw"
    if existing:  # --force: the earlier results survive a failed run untouched
        out.mkdir()
        (out / "keep.txt").write_text("earlier results")
    before = snapshot(tmp_path)
    real, calls = runner.evaluate, []

    def failing(cfg, *args):
        calls.append(cfg.level)
        if len(calls) == 3:
            raise error("boom at the 3rd level")
        return real(cfg, *args)

    monkeypatch.setattr(runner, "evaluate", failing)
    cfg = EvalConfig(
        scenario="sweep",
        n=10,
        epsilons=(1.0,),
        mechanisms=("rnm", "gem"),
        trials=2,
        workers=1,
        progress=False,
        out=out,
        force=existing,
    )
    with pytest.raises(error, match="boom"):
        run_sweep(cfg)
    assert calls == list(SWEEP_LEVELS[:3])
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == (["sw"] if existing else [])


def test_failed_sweep_into_new_parents_leaves_nothing(tmp_path, monkeypatch, unrendered):
    out = tmp_path / "a" / "b" / "sw"  # a/ does not exist yet

    def boom(*a):
        raise RuntimeError("boom")

    cfg = EvalConfig(
        scenario="sweep", n=10, epsilons=(1.0,), mechanisms=("rnm",), trials=2, workers=1, progress=False, out=out
    )
    with monkeypatch.context() as mp, pytest.raises(RuntimeError, match="boom"):
        mp.setattr(plots, "sweep_figure", boom)
        run_sweep(cfg, levels=(-0.8, 0.8))  # both levels were written into the temp dir first
    assert list(tmp_path.iterdir()) == []
    result = run_sweep(cfg, levels=(-0.8, 0.8))
    assert result.out == out and sorted(p.name for p in out.iterdir()) == sorted(
        ["report.md", "sweep.csv", "sweep.parquet", "sweep.png", "t-0.8", "t0.8"]
    )
    assert result.levels[1].result.out == out / "t0.8" and sorted(p.name for p in out.parent.iterdir()) == ["sw"]


def test_plots_survive_an_all_zero_mse(tmp_path):
    # t = −5, n = 10: GEM picks the top item in every trial, so there is nothing to draw on log axes.
    cfg = EvalConfig(
        scenario="sweep",
        n=10,
        users=1,
        epsilons=(1.0,),
        mechanisms=("gem",),
        trials=2,
        workers=1,
        progress=False,
        out=tmp_path / "sw",
    )
    res = run_sweep(cfg, levels=(-5.0,))
    assert res.table["mse"].to_list() == [0.0] and np.isnan(res.table["mse_rel_rnm"].to_numpy()).all()  # no rnm
    for png in ("t-5/mse_vs_epsilon.png", "sweep.png"):
        assert (tmp_path / "sw" / png).stat().st_size > 0
    assert "best mechanism and its MSE (rnm not run)" in (tmp_path / "sw" / "report.md").read_text()
    assert res.levels[0].result.out == tmp_path / "sw" / "t-5"  # points at the renamed directory
