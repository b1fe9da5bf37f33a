"""The `auto` policy table: its grid, its numbers (exact expectations and Monte Carlo
against independent recomputations), the lookup rule, and the checks that refuse a bad table."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from recsvc.artifact import POLICY_SCHEMA, ArtifactError, CandidateMatrix
from recsvc.mechanisms import (
    MECHANISMS,
    MechanismInputError,
    check_params,
    default_mechanisms,
    expectation,
    probabilities,
    select_batch,
    select_slate,
    slate_probabilities,
)
from recsvc.mechanisms.clm import first_item_means
from recsvc.policy import (
    EVALUATION_EPSILONS,
    POLICY_EPSILONS,
    PolicySpec,
    PolicyTable,
    build_table,
    method_of,
    nearest,
    population_mse,
)
from recsvc.rng import user_stream


def _population(users: int = 5, n: int = 12, seed: int = 3) -> CandidateMatrix:
    """Positively correlated scores and Δ (SANSA-like); the last user has fewer candidates (padding)."""
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.1, 1.0, (users, n))
    raw = d * rng.uniform(0.3, 1.2, (users, n)) + 0.05 * rng.standard_normal((users, n))
    lo, hi = np.zeros((users, n)), d.copy()
    count = np.full(users, n)
    count[-1] = n - 4
    pad = np.arange(n)[None, :] >= count[:, None]
    raw[pad], lo[pad], hi[pad], d[pad] = -np.inf, -np.inf, -np.inf, 1.0
    idx = np.where(pad, -1, np.arange(n)[None, :])
    return CandidateMatrix(np.array([f"p{b}" for b in range(users)]), idx, raw, lo, hi, d, count)


def test_the_grid_holds_the_evaluation_grid_and_four_points_per_decade():
    g = np.array(POLICY_EPSILONS)
    assert set(EVALUATION_EPSILONS) <= set(POLICY_EPSILONS)
    assert (np.diff(g) > 0).all() and g[0] == 0.01 and g[-1] == 16.0
    for a in (-2, -1, 0):  # every full decade in [0.01, 10)
        assert ((g >= 10.0**a) & (g < 10.0 ** (a + 1))).sum() >= 4, a
    # log spacing: no gap wider than a quarter decade (10^0.25 ≈ 1.78)
    assert (g[1:] / g[:-1]).max() <= 10**0.25 * 1.001


@pytest.mark.parametrize("n", [1, 2, 7, 500])
def test_expectation_equals_probabilities_times_values(n):
    rng = np.random.default_rng(n)
    q, d = rng.uniform(0, 1, n), rng.uniform(0.05, 1, n)
    v = (q.max() - q) ** 2
    for name, m in MECHANISMS.items():
        if not m.exact or (name == "rnm_laplace" and n == 500):  # exact but slow: covered at small n
            continue
        for eps in (1e-3, 0.1, 2.0, 40.0, 1e4):
            want = float(probabilities(name, q, d, eps) @ v)
            assert expectation(name, q, d, eps, v) == pytest.approx(want, rel=1e-11, abs=1e-300), (name, eps)


def test_expectation_refuses_bad_values_and_inexact_mechanisms():
    q, d = np.array([0.2, 0.9, 0.5]), np.ones(3)
    with pytest.raises(MechanismInputError, match=r"values must be 3 finite numbers ≥ 0 \(one per candidate\)"):
        expectation("rnm", q, d, 1.0, np.array([0.0, -1.0, 0.0]))
    with pytest.raises(MechanismInputError, match="values must be 3"):
        expectation("rnm", q, d, 1.0, np.zeros(2))
    with pytest.raises(NotImplementedError, match="'rs' has no exact selection probabilities"):
        expectation("rs", q, d, 1.0, np.zeros(3))
    assert method_of("rs") == method_of("rs_improved") == method_of("rnm_laplace") == "monte-carlo"
    assert {method_of(m) for m in ("rnm", "pf", "em", "krr", "random", "gem", "mgem", "combined_gem")} == {"exact"}


SPEC = PolicySpec(epsilons=(0.1, 1.0, 10.0), ks=(1, 3), trials=40, seed=7)


@pytest.fixture(scope="module")
def table() -> pl.DataFrame:
    return build_table(_population(), SPEC)[0]


def _independent_mse(pop: CandidateMatrix, name: str, eps: float) -> float:
    """Mean over users of E[(max q − q_A)²]: probabilities where exact, else the user's own stream."""
    q_all = pop.clipped()
    out = []
    for b in range(len(pop.count)):
        c = int(pop.count[b])
        q, d = q_all[b, :c], pop.sensitivity[b, :c]
        gap2 = (q.max() - q) ** 2
        if method_of(name) == "exact":
            out.append(float(probabilities(name, q, d, eps) @ gap2))
        else:
            sel = select_batch(name, q[None], d, eps, SPEC.trials, SPEC.seed, user_offset=b)[0]
            out.append(float(gap2[sel].mean()))
    return float(np.mean(out))


def test_table_values_are_population_means_of_each_mechanisms_expected_mse(table):
    pop = _population()
    one_shot = ("oneshot", "gumbel", "clm")
    assert SPEC.slate_mechanisms == one_shot and SPEC.mechanisms_at(3) == (*one_shot, *SPEC.mechanisms)
    assert table.height == len(SPEC.epsilons) * (2 * len(SPEC.mechanisms) + len(one_shot))
    assert set(table.filter(pl.col("k") == 1)["mechanism"]) == set(default_mechanisms())  # the registry's default set
    assert set(table.filter(pl.col("k") == 3)["mechanism"]) == {*default_mechanisms(), *one_shot}
    for row in table.filter(pl.col("k") == 1).iter_rows(named=True):
        want = _independent_mse(pop, row["mechanism"], row["epsilon"])
        assert row["expected_mse"] == pytest.approx(want, rel=1e-9), row
        assert row["method"] == method_of(row["mechanism"])
    # k = 3 ranks the slate's first item: peeling selects it with ε/3 (the k = 1 value at ε/3), and
    # so do oneshot and gumbel (rnm's and em's law at ε/3, exactly); clm's is a uniform member of its set.
    same_first = {"oneshot": "rnm", "gumbel": "em"}
    clm_first = []
    for row in table.filter(pl.col("k") == 3).iter_rows(named=True):
        if row["mechanism"] == "clm":
            clm_first.append(row)
            continue
        want = _independent_mse(pop, same_first.get(row["mechanism"], row["mechanism"]), row["epsilon"] / 3)
        assert row["expected_mse"] == pytest.approx(want, rel=1e-9), row
    assert {r["method"] for r in clm_first} == {"monte-carlo"} and len(clm_first) == len(SPEC.epsilons)
    q_all, p = pop.clipped(), check_params({}, MECHANISMS["clm"])
    want = []  # each user's own class draws (stream (user, 1)), shared by the grid's ε
    for b in range(len(pop.count)):
        q, d = q_all[b, : pop.count[b]], pop.sensitivity[b, : pop.count[b]]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(SPEC.seed, spawn_key=(b, 1))))
        want.append(first_item_means(q, d, SPEC.epsilons, p, 3, (q.max() - q) ** 2, rng, SPEC.trials))
    got = [r["expected_mse"] for r in sorted(clm_first, key=lambda r: r["epsilon"])]
    assert got == pytest.approx(np.mean(want, axis=0), rel=1e-12)
    # ties go to the one-shot mechanism: the same first item, one pass instead of three
    ranks = {(r["epsilon"], r["mechanism"]): r["rank"] for r in table.filter(pl.col("k") == 3).iter_rows(named=True)}
    assert all(
        ranks[(e, "oneshot")] < ranks[(e, "rnm")] and ranks[(e, "gumbel")] < ranks[(e, "em")] for e in SPEC.epsilons
    )
    # ranks order the expected MSE within each (ε, k)
    for (_, _), g in table.group_by("epsilon", "k"):
        g = g.sort("rank")
        assert g["rank"].to_list() == list(range(1, g.height + 1))
        assert (np.diff(g["expected_mse"].to_numpy()) >= 0).all()
    # at large ε the mechanisms that concentrate on the argmax win; uniform never does
    best = dict(table.filter(pl.col("rank") == 1).select("epsilon", "mechanism").rows())
    assert best[10.0] != "random" and best[0.1] != "random"


def test_slate_first_item_matches_select_slate():
    """The k-row's meaning, checked by simulation: the first item of select_slate(ε, k)."""
    pop = _population(users=2, n=10, seed=11)  # row 0 has all 10 candidates
    q, d = pop.clipped()[0], pop.sensitivity[0]
    gap2 = (q.max() - q) ** 2
    rng = user_stream(5, 0)
    firsts = np.array([select_slate("mgem", q, d, 3.0, 3, rng)[0] for _ in range(3000)])
    mc = gap2[firsts]
    exact = expectation("mgem", q, d, 1.0, gap2)
    assert abs(mc.mean() - exact) < 4 * mc.std() / math.sqrt(mc.size)


@pytest.mark.parametrize("k, gamma", [(2, 0.5), (3, 0.0), (3, 1.0)])
def test_clm_first_item_mean_matches_its_exact_slate_law(k, gamma):
    rng = np.random.default_rng(4)
    q, d = rng.uniform(0, 1, 7), rng.uniform(0.2, 1.0, 7)
    gap2 = (q.max() - q) ** 2
    exact = sum(p * gap2[s[0]] for s, p in slate_probabilities("clm", q, d, 1.5, k, loss_weight=gamma).items())
    p = check_params({"loss_weight": gamma}, MECHANISMS["clm"])
    trials = 40_000
    draws = [first_item_means(q, d, (1.5, 0.5), p, k, gap2, np.random.default_rng(s), trials) for s in range(5)]
    exact_low = sum(pr * gap2[s[0]] for s, pr in slate_probabilities("clm", q, d, 0.5, k, loss_weight=gamma).items())
    # each is a mean of class means in [0, max gap²]: its standard error is below max gap² / (2·√trials)
    tol = 4 * gap2.max() / (2 * math.sqrt(5 * trials))
    assert abs(np.mean([x[0] for x in draws]) - exact) < tol and abs(np.mean([x[1] for x in draws]) - exact_low) < tol
    assert np.std([x[0] for x in draws]) > 0  # really drawn


def test_population_mean_does_not_depend_on_the_engine():
    from recsvc.engines import LocalEngine

    spec = PolicySpec(epsilons=(1.0,), ks=(1,), trials=20, seed=1, mechanisms=("rnm", "rs"))
    pop = _population(users=20)
    one = population_mse(pop, spec, LocalEngine(1, progress=False))
    two = population_mse(pop, spec, LocalEngine(2, progress=False))
    assert one[2] == two[2] == 20 and np.array_equal(one[1], two[1])


def test_nearest_is_log_scale_with_ties_to_the_lower_point():
    grid = (0.01, 0.1, 1.0, 4.0, 16.0)
    assert nearest(grid, 0.001) == 0.01 and nearest(grid, 1e6) == 16.0  # ends clamp
    assert nearest(grid, 2.0) == 1.0  # √(1·4) = 2: the tie goes to the lower point
    assert nearest(grid, 2.0001) == 4.0 and nearest(grid, 1.9999) == 1.0
    assert nearest(grid, 0.0316) == 0.01 and nearest(grid, 0.0317) == 0.1  # √(0.01·0.1) ≈ 0.03162
    assert nearest(grid, 4.0) == 4.0
    assert [nearest((1, 5, 10), k) for k in (1, 2, 3, 5, 7, 8, 10, 50)] == [1, 1, 5, 5, 5, 10, 10, 10]


def _frame(rows) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema=POLICY_SCHEMA,
        orient="row",
    )


def test_policy_table_resolves_each_k_on_its_own_grid(table):
    t = PolicyTable.from_frame(table)
    assert t.ks == (1, 3) and t.epsilons == (0.1, 1.0, 10.0)
    best = {(k, e): m for k, e, m, _ in t.winners()}
    assert t.resolve(0.3, 1) == best[(1, 0.1)]  # √(0.1·1) ≈ 0.316 > 0.3
    assert t.resolve(50.0, 2) == best[(3, 10.0)]  # k = 2 is nearer 3 than 1 in log scale
    assert t.grid_point(0.3163, 1) == (1, 1.0) and t.grid_point(3.1622, 1) == (1, 1.0)
    hand = PolicyTable.from_frame(
        _frame(
            [
                (1.0, 1, "rnm", 0.2, 2, "exact"),
                (1.0, 1, "krr", 0.1, 1, "exact"),
                (8.0, 1, "krr", 0.3, 2, "exact"),
                (8.0, 1, "mgem", 0.01, 1, "exact"),
            ]
        )
    )
    assert [hand.resolve(e) for e in (0.01, 1.0, 2.8, 2.9, 100.0)] == ["krr", "krr", "krr", "mgem", "mgem"]


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], r"the grid is empty; expected at least one"),
        (
            [(1.0, 1, "magic", 0.1, 1, "exact")],
            r"unknown mechanism\(s\) 'magic' \(made by another version\?\); expected some of rnm",
        ),
        ([(1.0, 1, "rnmh", 0.1, 1, "exact")], r"rnmh is not differentially private"),
        ([(1.0, 1, "rnm", 0.1, 1, "exact"), (1.0, 1, "gem", 0.2, 1, "exact")], r"ranks must be 1..m within each"),
        ([(1.0, 1, "rnm", float("nan"), 1, "exact")], r"expected_mse must be finite and ≥ 0"),
        ([(0.0, 1, "rnm", 0.1, 1, "exact")], r"epsilon must be finite and > 0 and k ≥ 1"),
    ],
)
def test_a_bad_table_is_refused_with_a_clear_error(rows, message):
    with pytest.raises(ArtifactError, match=r"^art/policy.parquet: .*" + message):
        PolicyTable.from_frame(_frame(rows), "art/policy.parquet")


def test_spec_checks_name_the_bad_parameter():
    from recsvc.checks import ParamError

    for spec, message in (
        (PolicySpec(trials=0), "trials"),
        (PolicySpec(ks=(0,)), "ks"),
        (PolicySpec(mechanisms=("rnmh",)), "mechanisms"),
        (PolicySpec(epsilons=()), "epsilons"),
        (PolicySpec(slate_mechanisms=("rnm",)), "slate_mechanisms must be private one-shot top-k mechanisms"),
        (PolicySpec(mechanisms=("rnm", "clm")), "slate_mechanisms .* not in mechanisms, got \\['clm'\\]"),
    ):
        with pytest.raises(ParamError, match=message):
            spec.check()
