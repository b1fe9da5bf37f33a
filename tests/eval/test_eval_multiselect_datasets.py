"""`recsvc eval-multiselect --artifacts` on a real (tiny synthetic) artifact from `recsvc prep`:
the CSV's rows and columns, the numbers the setting forces (k = the whole catalog reaches the
optimum, ε → ∞ matches the noise-free response, more results help), the device's re-rank by
hand, reproducibility, and bad input refused before anything is written."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from eval.multiselect.data import DatasetConfig
from eval.multiselect.eval import Context, device_choice, measures
from eval.multiselect.run import SCHEMA, run_datasets
from recsvc.app.cli import main as recsvc_main

ITEMS = 150  # the tiny preset's catalog


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from data_prep.pipeline import run
    from data_prep.testing import tiny_prep

    return run(tiny_prep(tmp_path_factory.mktemp("ms") / "tiny"))


def _at(t: pl.DataFrame, mode: str, k: int, eps: float) -> dict:
    return t.filter((pl.col("mode") == mode) & (pl.col("k") == k) & (pl.col("epsilon") == eps)).row(0, named=True)


def test_the_csv_holds_every_row_and_the_numbers_the_setting_forces(tiny: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "res"
    argv = ["eval-multiselect", "--artifacts", str(tiny), "--out", str(out), "--users", "30", "--trials", "4"]
    assert recsvc_main([*argv, "--ks", "20", "1", str(ITEMS), "--epsilons", "1e6", "1", "--workers", "1"]) == 0
    assert "synthetic-tiny at ε = 1, utility fraction: code greedy k=1" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"multiselect.csv", "report.md", "utility_fraction.png", "hit_rate.png"}
    assert not list(tmp_path.glob(".res*"))
    t = pl.read_csv(out / "multiselect.csv", infer_schema_length=None)
    assert tuple(t.columns) == tuple(SCHEMA)
    # three responses × 3 k × (2 ε + no noise) + the greedy without signal, two central modes × 2 ε, the best
    assert t.height == 3 * 3 * 3 + 3 + 2 * 2 + 1 and set(t["users"]) == {30}
    best = _at(t, "nonprivate", 1, math.inf)
    assert best["utility_fraction"] == 1.0 and best["mse"] < 1e-6
    for mode in ("multiselect-code", "multiselect", "multiselect-baseline"):
        for eps in (1.0, 1e6, math.inf):
            # k = every item: the device re-ranks the whole catalog, so it gets the best item
            whole = _at(t, mode, ITEMS, eps)
            assert whole["utility_fraction"] == pytest.approx(1.0, abs=1e-12)
            assert whole["hit_rate"] == pytest.approx(best["hit_rate"], abs=1e-12)
        for k in (1, 20, ITEMS):  # at ε = 10⁶ the noise changes no answer of these users
            huge, free = _at(t, mode, k, 1e6), _at(t, mode, k, math.inf)
            assert huge["utility_fraction"] == pytest.approx(free["utility_fraction"], abs=1e-12)
    whole = _at(t, "multiselect", ITEMS, 0.0)  # no signal, but every item: still the best
    assert whole["utility_fraction"] == pytest.approx(1.0, abs=1e-12)
    for eps in (0.0, 1.0, 1e6):  # more results help: k = 20 beats k = 1 beyond both CIs
        one, twenty = _at(t, "multiselect", 1, eps), _at(t, "multiselect", 20, eps)
        assert (
            twenty["utility_fraction"] - twenty["utility_fraction_ci"]
            > one["utility_fraction"] + one["utility_fraction_ci"]
        )
    for mode in ("recommend-auto", "select-top500-auto"):  # central modes at huge ε: near the argmax
        # (auto resolves to mgem here, whose ε → ∞ limit is close to, not exactly, the argmax)
        assert _at(t, mode, 1, 1e6)["utility_fraction"] > 0.95
        low = _at(t, mode, 1, 1.0)
        assert 0.0 < low["utility_fraction"] < 0.9 and low["mechanism"] in ("mgem", "gem", "rnm")
    assert t.filter(pl.col("mode") == "select-top500-auto")["end_to_end_dp"].to_list() == [False, False]
    assert all(t.filter(pl.col("mode").is_in(["multiselect", "multiselect-code"]))["end_to_end_dp"])


def test_the_device_keeps_its_best_unseen_item_and_the_measures_are_exact() -> None:
    device = np.array([0.3, -np.inf, 0.9, 0.9, 0.1])  # item 1 was seen
    answers = np.array([[0, 2, 3], [1, 4, 0], [1, 1, 1], [3, 2, 0]])
    np.testing.assert_array_equal(device_choice(device, answers), [2, 0, 1, 3])  # ties → earlier in the answer
    v = np.array([0.3, 0.0, 0.9, 0.6, 0.1])  # the seen item is worth 0
    q = np.clip(v, 0.0, 0.8)
    target = np.array([False, False, False, True, False])
    frac, hit, mse = measures(np.array([2, 3, 1, 3]), v, q, target)
    assert frac == pytest.approx((0.9 + 0.6 + 0.0 + 0.6) / 4 / 0.9)
    assert hit == 0.5
    assert mse == pytest.approx((0.0 + 0.2**2 + 0.8**2 + 0.2**2) / 4)


def test_runs_are_reproducible_and_the_seed_matters(tiny: Path) -> None:
    cfg = DatasetConfig((tiny,), users=5, ks=(1, 5), epsilons=(2.0,), trials=3, workers=1, chunk_size=2, progress=False)
    first, again = run_datasets(cfg), run_datasets(replace(cfg, chunk_size=5))
    assert first.table.equals(again.table) and first.out is None  # chunking changes nothing
    other = run_datasets(replace(cfg, seed=1))
    noisy = pl.col("epsilon").is_finite()
    assert not first.table.filter(noisy)["utility_fraction"].equals(other.table.filter(noisy)["utility_fraction"])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--ks", "0"], r"--ks must be an integer ≥ 1, got 0"),
        (["--ks", str(ITEMS + 1)], rf"--ks: k = {ITEMS + 1} is more than the {ITEMS} items of synthetic-tiny"),
        (["--epsilons", "0"], r"--epsilons must be a positive finite number"),
        (["--epsilons", "-1"], r"--epsilons must be a positive finite number"),
        (["--epsilons", "inf"], r"--epsilons must be a positive finite number"),
        (["--users", "0"], r"--users must be an integer ≥ 1"),
        (["--trials", "0"], r"--trials must be an integer ≥ 1"),
    ],
)
def test_bad_input_is_refused_before_any_output(tiny, args, match, tmp_path, one_line_error, snapshot) -> None:
    before = snapshot(tiny)
    out = tmp_path / "new" / "res"
    assert recsvc_main(["eval-multiselect", "--artifacts", str(tiny), "--out", str(out), *args]) == 2
    one_line_error(match)
    assert not (tmp_path / "new").exists() and snapshot(tiny) == before


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        (False, r"has no test_targets.parquet .* rebuild it with `recsvc prep`"),
        (True, r"has no client bundle \(client/\) .* rebuild it with `recsvc prep`"),
    ],
)
def test_an_artifact_without_targets_or_a_client_bundle_is_refused(targets, match, tmp_path, one_line_error) -> None:
    from eval.testing import make_catalog_artifact

    art = make_catalog_artifact(tmp_path / "old", targets=targets)
    assert recsvc_main(["eval-multiselect", "--artifacts", str(art), "--out", str(tmp_path / "res")]) == 2
    one_line_error(match)
    assert not (tmp_path / "res").exists()


def test_auto_resolves_as_the_service_does(tiny: Path) -> None:
    """The central modes run what the service's `auto` would: the policy table up to the count it
    covers (with the table's γ), the sign rule beyond it (Recommend over all 150 items)."""
    from eval.multiselect.data import DatasetSource
    from eval.multiselect.eval import AutoPolicy
    from recsvc.artifact import load_artifact
    from recsvc.service.config import SelectorConfig
    from recsvc.service.selection import Selector

    auto = AutoPolicy.of(DatasetSource(tiny, 2, (1,)))
    service = Selector(load_artifact(tiny), SelectorConfig())
    assert auto.covers is not None and auto.covers < ITEMS and auto.params == {"gamma": 0.05}
    for eps in (0.05, 0.5, 1.0, 4.0, 16.0):
        for n in (20, auto.covers, auto.covers + 1, ITEMS):
            name, params = service.resolve("auto", eps, 1, n, {})
            assert auto.choose(eps, n) == (name, dict(params)), (eps, n)
    assert auto.choose(16.0, ITEMS) == ("mgem", {})  # the sign rule: median Spearman 0.17 > 0.1


@pytest.fixture(scope="module")
def ctx(tiny: Path) -> Context:
    """What eval-multiselect shares across the tiny artifact's chunks: 3 users, k ∈ {1, 3}, ε = 2."""
    from eval.multiselect.data import DatasetSource

    return Context.of(DatasetSource(tiny, 3, (1, 3)), (1, 3), (2.0,), 4, 0)


def test_the_greedy_row_is_what_the_service_answers_to_the_lattice_signal_the_device_sends(ctx: Context) -> None:
    from eval.multiselect.eval import GREEDY, TAG, Row, evaluate_user, rows
    from recsvc.multiselection import Words, respond_lattice
    from recsvc.rng import stream

    src = ctx.source
    chunk = src.chunk(range(3))
    grid = src.bundle.lattice
    assert np.array_equal(ctx.points, grid.point(src.population.embeddings))
    for b in range(3):
        words = Words(stream(0, b, TAG, 0, 0))
        signals = [grid.signal(chunk.embedding[b], 2.0, words) for _ in range(4)]
        assert all(z.dtype == np.int64 and np.abs(z).sum() < 100 * grid.radius for z in signals)  # integers on the grid
        answers = np.stack([respond_lattice(src.population, ctx.points, z, 2.0, grid, 3) for z in signals])
        want = measures(
            device_choice(chunk.device_scores(b), answers),
            chunk.value(b),
            np.clip(chunk.value(b), src.lo, src.hi),
            chunk.target[b],
        )
        got = evaluate_user(ctx, chunk, b)[rows(ctx.ks, ctx.epsilons).index(Row(GREEDY, 3, 2.0))]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)  # the same draws, the same arithmetic


def test_the_code_row_is_what_the_service_answers_to_the_code_the_device_sends(ctx: Context) -> None:
    from eval.multiselect.eval import CODE, TAG, Row, evaluate_user, rows
    from recsvc.multiselection import Words, code_of, prototype_codes, randomized_response, respond_code
    from recsvc.rng import stream

    src = ctx.source
    chunk = src.chunk(range(3))
    book, pop = src.bundle.codebook, src.population
    codes = prototype_codes(pop, book)
    for b in range(3):
        dev = chunk.device_scores(b)
        x = code_of(dev[book])
        words = Words(stream(0, b, TAG, 3, 0))
        sent = [randomized_response(x, book.size, 2.0, words) for _ in range(4)]
        answers = np.stack([respond_code(pop, codes, y, 2.0, 3) for y in sent])
        want = measures(
            device_choice(dev, answers), chunk.value(b), np.clip(chunk.value(b), src.lo, src.hi), chunk.target[b]
        )
        got = evaluate_user(ctx, chunk, b)[rows(ctx.ks, ctx.epsilons).index(Row(CODE, 3, 2.0))]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
