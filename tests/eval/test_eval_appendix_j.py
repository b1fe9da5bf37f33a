"""Appendix J: the utility-bound rules (eqs 18–19) against exact expected MSE on scenarios 1, 2, 4, 5."""

import math

import numpy as np
import polars as pl
import pytest

from eval.appendix_j.rules import RULES, hit_rates, markdown, predict


def test_rules_on_hand_computed_instances():
    q = np.array([1.0, 1.0, -1.0, -1.0])

    # eq. 19: Δ* > (q* − q−)/(4 ln(n/β)/ε); here 2ε/(4 ln 80) = ε/8.76
    def reach(eps: float) -> float:
        return 2.0 * eps / (4.0 * math.log(4 / 0.05))

    p = predict(q, [1.8, 1.8, 1.0, 1.0], 4.0)  # scenario-1 shape: best Δ 1.8 > reach(4) = 0.46
    assert p.gem_worse_than_random and p.mgem_worse_than_random and p.gem_worse_than_rnm
    eps = 1.5 / reach(1.0)  # reach = 1.5: above Δ− = 1.0, below Δ* = 1.8
    p = predict(q, [1.8, 1.8, 1.0, 1.0], eps)
    assert p.gem_worse_than_random and not p.mgem_worse_than_random
    p = predict(q, [1.0, 1.0, 1.8, 1.8], 100.0)  # scenario-2 shape: Δ* = 1 > 1.8/2 fires eq. 18; reach 11.4
    assert p.gem_worse_than_rnm and not p.gem_worse_than_random
    assert not predict(q, [0.8, 1.0, 1.8, 1.8], 1.0).gem_worse_than_rnm  # 0.8 ≤ 1.8/2
    # ties: the best candidates' smallest Δ, the worst ones' largest
    assert not predict(q, [0.5, 1.8, 1.8, 0.1], 1.0).gem_worse_than_rnm
    assert predict(q, [0.1, 0.1, 0.1, 1.8], 1.0).mgem_worse_than_random
    for bad in (dict(epsilon=0.0), dict(epsilon=float("nan")), dict(epsilon=1.0, beta=1.0)):
        with pytest.raises(ValueError, match=r"ε must be a positive finite number|expected β in \(0, 1\)"):
            predict(q, [1.0] * 4, **bad)
    with pytest.raises(ValueError, match="one shape"):
        predict(q, [1.0] * 3, 1.0)


def test_hit_rates_against_exact_mse():
    """The rules are worst-case bounds: they never miss a case where GEM / mGEM really is worse
    (0 misses in every scenario), but eq. 19 fires far more often than it happens (at every ε up to
    8 in scenarios 2 and 5, where GEM is never worse than random), so its hit rate is low; eq. 18
    is nearly always right except on the bimodal scenario 2 (Δ* = 1 > 1.8/2, yet GEM wins)."""
    t = hit_rates(users=20)
    assert t.height == 5 * len(RULES) and (t["misses"] == 0).all()
    rate = {(r["scenario"], r["rule"]): (r["hits"], r["cases"]) for r in t.iter_rows(named=True)}
    assert rate["1", "gem_worse_than_random"] == (9, 11) and rate["2", "gem_worse_than_random"] == (1, 11)
    assert rate["1", "mgem_worse_than_random"] == (1, 11) and rate["2", "mgem_worse_than_random"] == (9, 11)
    assert rate["1", "gem_worse_than_rnm"] == (11, 11) and rate["2", "gem_worse_than_rnm"] == (1, 11)
    assert rate["4", "gem_worse_than_random"] == (200, 220) and rate["5", "gem_worse_than_random"] == (52, 220)
    assert rate["4", "gem_worse_than_rnm"] == rate["5", "gem_worse_than_rnm"] == (220, 220)
    happened = t.filter((pl.col("scenario") == "5") & (pl.col("rule") == "gem_worse_than_random"))["happened"]
    assert happened.item() == 0
    text = markdown(t)
    assert "| GEM worse than random (eq. 19) | 81.8% (11/9/0 of 11) |" in text


def test_the_study_writes_the_hit_rates_and_their_report(tmp_path):
    from eval.appendix_j.rules import STUDY, AppendixJConfig
    from eval.study import execute

    out = tmp_path / "j"
    result = execute(STUDY, AppendixJConfig(out=out, scenarios=("1", "4"), users=5, epsilons=(1.0,)))
    assert sorted(p.name for p in out.iterdir()) == ["hit_rates.csv", "report.md"]
    assert pl.read_csv(out / "hit_rates.csv").equals(result.table)
    assert result.table.equals(hit_rates(("1", "4"), 5, (1.0,)))
    assert markdown(result.table) in (out / "report.md").read_text()
