"""Figure 18 (Appendix E): scenarios 1–3 as the proportion of high scores varies, at ε = 2."""

import numpy as np
import polars as pl
import pytest

from eval.evaluation.config import EvalConfig
from eval.scenarios import scenario
from eval.scenarios.proportion import PROPORTIONS, run_proportion
from recsvc.app.cli import main as recsvc_main
from recsvc.mechanisms.exact import random_stopping_two_candidates_lower
from recsvc.mechanisms.testing import random_stopping_probabilities_quad

MECHS = ("rnm", "krr", "random", "gem", "mgem", "rs", "rnmh")


@pytest.fixture(scope="module")
def fig18(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "fig18"
    cfg = EvalConfig(
        scenario="proportion",
        mechanisms=MECHS,
        epsilons=(2.0,),
        exact=True,
        trials=2000,
        params={"gamma": 0.05},
        progress=False,
        workers=1,
        out=out,
    )
    return run_proportion(cfg)


def _mse(res, kind):
    t = res.table.filter(pl.col("kind") == kind).sort("proportion")
    return {m: t.filter(pl.col("mechanism") == m)["mse"].to_numpy() for m in MECHS}


def test_bimodal_proportion_instances():
    for p, high in ((0.01, 1), (0.3, 30), (0.5, 50), (0.99, 99)):
        s1, s2, s3 = (scenario(k, proportion=p) for k in "123")
        assert (s1.scores > 0).sum() == high and np.array_equal(s1.scores, s3.scores)
        assert set(s1.sensitivities[s1.scores > 0]) == {1.8} and set(s1.sensitivities[s1.scores < 0]) == {1.0}
        assert set(s2.sensitivities[s2.scores > 0]) == {1.0} and set(s2.sensitivities[s2.scores < 0]) == {1.8}
        for grp in (1.0, -1.0):  # scenario 3: Δ alternates inside each group, starting with 1.8
            d = s3.sensitivities[s3.scores == grp]
            assert (d == 1.8).sum() == (len(d) + 1) // 2
    np.testing.assert_array_equal(scenario("3").sensitivities, np.where(np.arange(100) % 2 == 0, 1.8, 1.0))
    for bad in (0.0, 1.0, 0.004, 0.996):
        with pytest.raises(ValueError, match="at least one high and one low"):
            scenario("1", proportion=bad)


def test_two_group_random_stopping_matches_the_reference_quadrature():
    """The exact rs of a bimodal instance (two groups of tied candidates) against the per-candidate
    adaptive quadrature on the full 20-candidate instance."""
    s = scenario("2", n=20, proportion=0.3)
    for kind, gamma in (("rs", 0.05), ("rs_improved", 0.01)):
        ref = random_stopping_probabilities_quad(s.scores, s.sensitivities, 2.0, gamma, kind)[s.scores < 0].sum()
        got = random_stopping_two_candidates_lower(2.0, 1.8, 1.0, 2.0, gamma, kind, low_share=0.7)
        assert got == pytest.approx(ref, rel=1e-8), kind


def test_figure_18_proportions_under_positive_correlation(fig18):
    """Appendix E: with positive correlation RNMH, mGEM and RS beat RNM, kRR and GEM 'for most
    proportions', and the gap is largest with a few high scores and smallest at the extremes."""
    m = _mse(fig18, "1")
    rivals = np.min([m["rnm"], m["krr"], m["gem"]], axis=0)
    assert (m["mgem"] < rivals).all() and (m["rnmh"] < rivals).all()
    assert (m["rs"] < rivals)[1:].all() and m["rs"][0] > m["krr"][0]  # RS (exact) loses to kRR at 1 high score
    gap = np.min([m["rnm"], m["krr"]], axis=0) - np.min([m["mgem"], m["rs"], m["rnmh"]], axis=0)
    assert PROPORTIONS[int(np.argmax(gap))] == 0.1 and gap.max() > 2.0 and gap[0] < 0.7 and gap[-1] < 0.02


def test_figure_18_proportions_under_negative_correlation(fig18):
    """Only GEM gains from heterogeneity; RNMH and mGEM are worse than random at every split. RS
    (γ = 0.05, exact) is NOT: it is within 1.5% of random below half high scores (slightly better)
    and worse from half on (by up to 11% at 99%)."""
    m = _mse(fig18, "2")
    assert (m["gem"] < 0.9 * m["rnm"]).all() and (m["gem"] < 0.2 * m["rnm"])[-6:].all()
    for mech in ("mgem", "rnmh", "rs"):
        assert (m[mech] > m["rnm"]).all(), mech
    assert (m["mgem"] > m["random"]).all() and (m["rnmh"] > m["random"]).all()
    props = np.array(PROPORTIONS)
    rel = m["rs"] / m["random"] - 1
    assert ((rel < 0) == (props < 0.5)).all() and rel.min() > -0.015 and 0.09 < rel.max() < 0.12


def test_figure_18_proportions_without_correlation(fig18):
    """'RNM suffices at all splits' holds from 5% to 90% high scores; at the extremes one candidate
    is alone in its group with Δ = 1.8, which GEM (95%, 99%) or mGEM and RS (1%) exploit."""
    m = _mse(fig18, "3")
    props = np.array(PROPORTIONS)
    for mech, where in (("gem", (0.95, 0.99)), ("mgem", (0.01,))):
        assert set(props[m[mech] < m["rnm"]]) == set(where), mech
    middle = (props >= 0.05) & (props <= 0.9)
    assert (m["rnm"][middle] <= np.min([m["gem"], m["mgem"], m["rs"], m["krr"]], axis=0)[middle]).all()


def test_outputs_and_the_report(fig18):
    names = {p.name for p in fig18.out.iterdir()}
    assert names == {"proportion.csv", "proportion.parquet", "proportion.png", "report.md"}
    t = pl.read_parquet(fig18.out / "proportion.parquet")
    assert t.height == 3 * len(PROPORTIONS) * len(MECHS) and set(t["correlation"]) == {"positive", "negative", "none"}
    methods = dict(t.filter(pl.col("kind") != "3").group_by("mechanism").agg(pl.col("method").first()).iter_rows())
    assert methods["rs"] == "exact" and methods["rnmh"] == "monte-carlo"
    held = {f.statement.split(":")[0] + ":" + f.statement.split(":")[1][:12]: f.holds for f in fig18.findings}
    assert sum(held.values()) == 7 and len(held) == 9
    failed = [f.statement for f in fig18.findings if not f.holds]
    assert failed[0].startswith("negative: rs is worse than random") and failed[1].startswith("none:")
    assert "7 of 9 hold" in (fig18.out / "report.md").read_text()


def test_level_is_refused_and_nothing_is_written(tmp_path, one_line_error):
    out = tmp_path / "p"
    assert recsvc_main(["eval-synthetic", "--scenario", "proportion", "--level", "0.3", "--out", str(out)]) == 2
    one_line_error(r"--level applies only to --scenario sweep")
    assert recsvc_main(["eval-synthetic", "--scenario", "proportion", "--epsilons", "0", "--out", str(out)]) == 2
    one_line_error(r"--epsilons must be one or more values, each a finite number > 0")
    assert not out.exists() and not list(tmp_path.iterdir())
