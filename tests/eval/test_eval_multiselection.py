"""`recsvc eval-multiselect --theory` on a reduced grid: theory.csv matches the closed form and the
Monte Carlo estimate, the plots are written atomically, bad flags are refused before any output."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from eval.multiselect.theory import SCHEMA, TheoryConfig, parse_offsets, run_theory
from recsvc.app.cli import main as recsvc_main
from recsvc.multiselection import identity_error, identity_offsets

GRID = ["--ks", "10", "1", "3", "--epsilons", "2", "0.5", "--mc-draws", "20000"]


def test_theory_csv_holds_the_closed_form_and_a_close_monte_carlo(tmp_path, capsys):
    out = tmp_path / "ms"
    assert recsvc_main(["eval-multiselect", "--theory", "--out", str(out), *GRID]) == 0
    printed = capsys.readouterr().out
    assert "6 (k, ε) rows" in printed and "theory.csv" in printed
    assert {p.name for p in out.iterdir()} == {"theory.csv", "report.md", "offsets.png", "scaled_error.png"}
    assert not list(tmp_path.glob(".ms*"))  # no temp sibling left
    t = pl.read_csv(out / "theory.csv")
    assert tuple(t.columns) == tuple(SCHEMA)
    assert t["k"].to_list() == [1, 1, 3, 3, 10, 10] and t["epsilon"].to_list() == [0.5, 2.0] * 3
    for k, eps, error, mc, offsets in t.iter_rows():
        a = parse_offsets(offsets)
        assert len(a) == k and a == sorted(a)
        np.testing.assert_allclose(a, identity_offsets(eps, k), rtol=1e-13, atol=1e-13)
        assert error == pytest.approx(identity_error(eps, k), rel=1e-15)
        assert abs(mc - error) < 5 * error / math.sqrt(20_000)  # the loss's sd is about its mean
    row = t.filter((pl.col("k") == 3) & (pl.col("epsilon") == 2.0))
    assert parse_offsets(row["offsets"][0]) == pytest.approx([-math.log(4) / 2, 0.0, math.log(4) / 2], abs=1e-12)


def test_the_table_is_reproducible_and_the_monte_carlo_deviation_is_reported():
    cfg = TheoryConfig(ks=(2, 5), epsilons=(1.0,), mc_draws=5_000, seed=3)
    first, second = run_theory(cfg), run_theory(cfg)
    assert first.table.equals(second.table) and first.out is None
    assert 0 < first.max_z < 4.5


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--theory", "--ks", "0"], r"--ks must be an integer ≥ 1, got 0"),
        (["--theory", "--ks", "2", "2"], r"--ks must be distinct"),
        (["--theory", "--epsilons", "0"], r"--epsilons must be a positive finite number"),
        (["--theory", "--epsilons", "inf"], r"--epsilons must be a positive finite number"),
        (["--theory", "--mc-draws", "1"], r"--mc-draws must be an integer ≥ 2"),
    ],
)
def test_bad_flags_are_refused_before_any_output(args, match, tmp_path, one_line_error):
    out = tmp_path / "new" / "ms"
    assert recsvc_main(["eval-multiselect", "--out", str(out), *args]) == 2
    one_line_error(match)
    assert not (tmp_path / "new").exists()


def test_a_mode_is_required(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        recsvc_main(["eval-multiselect", "--out", str(tmp_path / "ms")])
    assert exc.value.code == 2 and "one of the arguments --theory --artifacts is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recsvc_main(["eval-multiselect", "--theory", "--artifacts", str(tmp_path)])
    assert "not allowed with argument" in capsys.readouterr().err and not (tmp_path / "ms").exists()


def test_an_existing_out_needs_force(tmp_path, one_line_error):
    out = tmp_path / "ms"
    argv = ["eval-multiselect", "--theory", "--out", str(out), "--ks", "2", "--epsilons", "1", "--mc-draws", "100"]
    assert recsvc_main(argv) == 0
    assert recsvc_main(argv) == 2
    one_line_error(r"--out .* already exists; pass --force")
    assert recsvc_main([*argv, "--force"]) == 0
