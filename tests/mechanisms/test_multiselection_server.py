"""The server's multi-selection response in d dimensions: posterior weights from the lattice
signal's exact likelihood, the sparse greedy against the exact dense greedy and brute force, the baseline."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from recsvc.checks import ParamError
from recsvc.multiselection import (
    Lattice,
    Population,
    baseline,
    clip_l1,
    dense_greedy,
    expected_utility,
    greedy,
    lattice_log_likelihood,
    respond_lattice,
    weights_from_log_likelihood,
)
from recsvc.multiselection.posterior import WEIGHT_FLOOR


def _population(scores: np.ndarray, top: int, d: int = 4, seed: int = 0) -> Population:
    """Each user's top ``top`` items of ``scores`` (P × n), with random clipped embeddings."""
    rng = np.random.default_rng(seed)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :top]
    emb = clip_l1(rng.normal(size=(scores.shape[0], d)), 1.0)
    return Population(emb, order.astype(np.int64), np.take_along_axis(scores, order, axis=1), scores.shape[1])


def _instance(p: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = rng.gamma(1.0, 1.0, (p, n)) * rng.uniform(0.2, 1.0, (1, n))
    w = rng.dirichlet(np.ones(p))
    return scores, w


def test_the_posterior_is_the_normalised_lattice_likelihood():
    rng = np.random.default_rng(1)
    grid = Lattice.of(2.0, 3)
    points = grid.point(clip_l1(rng.normal(size=(6, 3)), 2.0))
    z = np.array([300, -1000, 2000])
    eps = 0.7
    direct = np.exp(-np.abs(z - points).sum(axis=1) * eps / grid.sensitivity)
    w = weights_from_log_likelihood(lattice_log_likelihood(z, points, eps, grid))
    np.testing.assert_allclose(w, direct / direct.sum(), rtol=1e-12)


def test_the_posterior_is_computed_in_log_space_and_drops_only_negligible_weights():
    grid = Lattice.of(1.0, 2)
    points = np.array([[0, 0], [4096, 0], [0, 4096], [2048, 2048]])
    z = np.array([400, 0])
    # ε = 400: distances of ~200 scales, where e^-200 underflows a naive sum
    w = weights_from_log_likelihood(lattice_log_likelihood(z, points, 400.0, grid))
    assert np.isfinite(w).all() and w.sum() == pytest.approx(1.0)
    assert w[0] == pytest.approx(1.0) and (w[1:] == 0).all()
    # At a moderate ε every weight is within e^ε of every other (local DP), so none is dropped.
    w1 = weights_from_log_likelihood(lattice_log_likelihood(z, points, 1.0, grid))
    assert (w1 > 0).all() and w1.max() / w1.min() <= math.e + 1e-12
    assert math.exp(-20) > WEIGHT_FLOOR


def test_the_posterior_refuses_a_signal_of_the_wrong_length():
    with pytest.raises(ParamError, match=r"expected \(3,\)"):
        lattice_log_likelihood(np.zeros(2, np.int64), np.zeros((4, 3), np.int64), 1.0, Lattice.of(1.0, 3))


@pytest.mark.parametrize("seed", range(6))
def test_greedy_with_every_item_kept_equals_the_exact_dense_greedy(seed):
    scores, w = _instance(p=30, n=25, seed=seed)
    pop = _population(scores, top=25)
    for k in (1, 3, 7, 25):
        np.testing.assert_array_equal(greedy(pop, w, k), dense_greedy(scores, w, k))
    concentrated = np.where(np.arange(30) % 7 == seed % 7, w, 0.0)  # most users without weight
    concentrated /= concentrated.sum()
    for k in (2, 9, 25):
        np.testing.assert_array_equal(greedy(pop, concentrated, k), dense_greedy(scores, concentrated, k))


@pytest.mark.parametrize("seed", range(8))
def test_greedy_reaches_at_least_one_minus_one_over_e_of_the_best_subset(seed):
    scores, w = _instance(p=12, n=9, seed=100 + seed)
    pop = _population(scores, top=9)
    for k in (2, 3, 4):
        picked = greedy(pop, w, k)
        assert len(set(picked.tolist())) == k
        best = max(expected_utility(scores, w, s) for s in itertools.combinations(range(9), k))
        value = expected_utility(scores, w, picked)
        assert value >= (1 - 1 / math.e) * best - 1e-12
        assert value <= best + 1e-12


def test_the_greedy_guarantee_is_not_vacuous_on_these_instances():
    """Greedy is not always optimal here: the brute force above can tell them apart."""
    gaps = []
    for seed in range(40):
        scores, w = _instance(p=6, n=7, seed=300 + seed)
        best = max(expected_utility(scores, w, s) for s in itertools.combinations(range(7), 3))
        gaps.append(best - expected_utility(scores, w, dense_greedy(scores, w, 3)))
    assert max(gaps) > 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_the_sparse_top_l_greedy_stays_close_to_the_exact_greedy(seed):
    """Greedy on F_L may beat greedy on F (neither is optimal), so only a floor is asserted: the
    measured worst over these seeds is 1.0 at L = n/3, 0.96 at L = n/10, 0.88 at L = n/30."""
    scores, w = _instance(p=200, n=300, seed=seed)
    for k in (1, 5, 10):
        exact = expected_utility(scores, w, dense_greedy(scores, w, k))
        for top, floor in ((100, 0.99), (30, 0.95), (10, 0.85)):
            sparse = expected_utility(scores, w, greedy(_population(scores, top), w, k))
            assert sparse >= floor * exact, (k, top, sparse / exact)


def test_the_sparse_objective_bounds_the_true_one_from_above_and_is_exact_where_the_top_l_is_hit():
    scores, _ = _instance(p=40, n=60, seed=9)
    pop = _population(scores, top=8)
    rng = np.random.default_rng(0)
    for _ in range(20):
        items = rng.choice(60, 4, replace=False)
        hit = np.isin(pop.top_index, items)
        best_gain = np.where(hit, pop.gain, 0.0).max(axis=1)
        f_l = pop.floor + best_gain  # per user
        true = scores[:, items].max(axis=1)
        assert (f_l >= true - 1e-12).all()
        np.testing.assert_allclose(f_l[hit.any(axis=1)], true[hit.any(axis=1)], rtol=1e-12)


def test_greedy_ignores_zero_weight_users_and_returns_distinct_items_even_past_every_gain():
    scores = np.array([[5.0, 1.0, 0.0, 0.0], [0.0, 0.0, 9.0, 1.0]])
    pop = _population(scores, top=2)
    assert greedy(pop, np.array([1.0, 0.0]), 1).tolist() == [0]
    assert greedy(pop, np.array([0.0, 1.0]), 1).tolist() == [2]
    picked = greedy(pop, np.array([0.5, 0.5]), 4)
    assert picked.tolist() == [2, 0, 1, 3]  # then by expected score: item 1 (0.5), item 3 (0.5), lower row first
    np.testing.assert_array_equal(dense_greedy(scores, np.array([0.5, 0.5]), 4), [2, 0, 1, 3])


def test_items_no_population_user_holds_are_evaluated_as_gaining_nothing():
    """A batch of exact gains that ends with items in nobody's top L (a concentrated posterior
    exhausts the held items first)."""
    scores, _ = _instance(p=4, n=40, seed=11)
    pop = _population(scores, top=2)
    w = np.array([1.0, 0.0, 0.0, 0.0])
    picked = greedy(pop, w, 12)
    best = int(np.argmax(scores[0]))
    # The only user's best item, then nothing gains (its 2nd item is its floor): lowest rows first.
    assert picked.tolist() == [best, *[j for j in range(40) if j != best][:11]]


def test_respond_is_a_deterministic_function_of_the_signal():
    scores, _ = _instance(p=50, n=40, seed=3)
    pop = _population(scores, top=10, d=5).warm()
    grid = Lattice.of(1.0, 5)
    points = grid.point(pop.embeddings)
    z = np.rint(np.random.default_rng(0).normal(size=5) * 4096).astype(np.int64)
    a = respond_lattice(pop, points, z, 1.0, grid, 5)
    assert a.tolist() == respond_lattice(pop, points, z.copy(), 1.0, grid, 5).tolist()
    w = weights_from_log_likelihood(lattice_log_likelihood(z, points, 1.0, grid))
    assert a.tolist() == greedy(pop, w, 5).tolist()


def test_a_concentrated_posterior_answers_that_users_own_top_items():
    scores, _ = _instance(p=50, n=40, seed=4)
    pop = _population(scores, top=10, d=5)
    grid = Lattice.of(1.0, 5)
    points = grid.point(pop.embeddings)
    picked = respond_lattice(pop, points, points[17], 1e6, grid, 3)  # huge ε: the signal is user 17's point exactly
    # The first item covers the only user; the rest add nothing and follow that user's scores.
    assert picked.tolist() == np.argsort(-scores[17])[:3].tolist()


def test_the_baseline_is_the_top_k_of_the_signal_projected_on_the_item_factors():
    rng = np.random.default_rng(2)
    factors = rng.normal(size=(30, 4))
    s = rng.normal(size=4)
    assert baseline(s, factors, 5).tolist() == np.argsort(-(factors @ s))[:5].tolist()
    assert sorted(baseline(s, factors, 30).tolist()) == list(range(30))


@pytest.mark.parametrize("k", [0, 41, 2.0, True])
def test_k_outside_one_to_n_is_refused(k):
    scores, w = _instance(p=5, n=40, seed=0)
    with pytest.raises(ParamError, match=r"k must be an integer in 1\.\.40"):
        greedy(_population(scores, top=5), w, k)


def test_a_population_with_inconsistent_arrays_is_refused():
    with pytest.raises(ParamError, match="shapes do not match"):
        Population(np.zeros((3, 2)), np.zeros((2, 4), np.int64), np.zeros((2, 4)), 10)
    with pytest.raises(ParamError, match="finite exactly where"):
        Population(np.zeros((1, 2)), np.array([[0, -1]]), np.array([[1.0, 2.0]]), 10)
    with pytest.raises(ParamError, match="num_items"):
        Population(np.zeros((1, 2)), np.array([[10]]), np.array([[1.0]]), 10)
