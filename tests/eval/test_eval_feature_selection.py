"""DP-SIS and the two-stage baseline (eval.feature_selection): the stated sensitivities by brute
force over neighbouring datasets, an exact DP audit of DP-SIS's selection through ``clm``, recovery
of a planted support, and the TOP / GREAT / GOOD classes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest

from eval.feature_selection import data, methods, metrics
from recsvc.mechanisms import select_slate, slate_probabilities

Rows = tuple[np.ndarray, np.ndarray, list[np.ndarray]]


def _bounded(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Data in [−1, 1] whose first two rows are all ones, so every score is at least 2 and a
    replaced row can move it by the full 2 without crossing zero."""
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, n)
    x[:2], y[:2] = 1.0, 1.0
    return x, y


def _neighbours(
    x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], relation: str, grid: list[float]
) -> Iterator[Rows]:
    """Every neighbour with new rows from grid^(d+1), each with its partition: the changed row
    stays in (or joins, or leaves) one block, the others keep theirs."""
    n, d = x.shape
    new_rows = [np.array(r) for r in itertools.product(grid, repeat=d + 1)]
    if relation == "replace":
        for i, r in itertools.product(range(n), new_rows):
            x2, y2 = x.copy(), y.copy()
            x2[i], y2[i] = r[:d], r[d]
            yield x2, y2, parts
    else:
        for i in range(n):  # remove row i
            keep = np.arange(n) != i
            renum = np.cumsum(keep) - 1
            yield x[keep], y[keep], [renum[p[p != i]] for p in parts]
        for b, r in itertools.product(range(len(parts)), new_rows):  # add a row to block b
            x2, y2 = np.vstack([x, r[:d]]), np.append(y, r[d])
            yield x2, y2, [np.append(p, n) if j == b else p for j, p in enumerate(parts)]


@pytest.mark.parametrize("relation", methods.NEIGHBOURING)
def test_sis_scores_move_by_at_most_the_stated_sensitivity_and_reach_it(relation) -> None:
    x, y = _bounded(5, 3, seed=1)
    parts = methods.blocks(5)
    base = methods.sis_scores(x, y)
    moves = [
        np.abs(methods.sis_scores(x2, y2) - base).max()
        for x2, y2, _ in _neighbours(x, y, parts, relation, [-1.0, 0.0, 1.0])
    ]
    assert max(moves) == pytest.approx(methods.SIS_SENSITIVITY[relation], abs=1e-12)
    assert max(moves) <= methods.SIS_SENSITIVITY[relation] + 1e-12


@pytest.mark.parametrize("relation", methods.NEIGHBOURING)
def test_block_support_counts_move_by_at_most_one(relation) -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (9, 2))
    y = x @ np.array([1.0, 0.0]) + rng.normal(0, 0.05, 9)
    parts = methods.blocks(9)  # three blocks of three rows
    base = methods.support_counts(x, y, parts, 0.05)
    moves = [
        np.abs(methods.support_counts(x2, y2, p2, 0.05) - base).max()
        for x2, y2, p2 in _neighbours(x, y, parts, relation, [-1.0, 1.0])
    ]
    assert max(moves) == methods.COUNT_SENSITIVITY[relation] == 1.0


def test_max_abs_preprocessing_bounds_every_entry_by_one() -> None:
    ds = data.fan_lv(np.random.default_rng(3), shape=(30, 50), nonzero=4)
    x, y = data.max_abs(ds.x, ds.y)
    assert np.abs(x).max(axis=0) == pytest.approx(np.ones(50)) and np.abs(y).max() == pytest.approx(1.0)
    assert np.abs(x.mean(axis=0)).max() < 1e-12 and abs(y.mean()) < 1e-12
    assert methods.sis_scores(x, y).max() <= methods.sis_bound(30)


@pytest.mark.parametrize("relation", methods.NEIGHBOURING)
def test_dp_sis_is_epsilon_dp_on_every_neighbour_exactly(relation) -> None:
    """Exact slate probabilities of clm on the scores of D and of every neighbour D': the set
    chosen never changes in probability by more than e^ε, with Δ as stated for the relation."""
    eps, k = 1.0, 2
    x, y = _bounded(3, 4, seed=4)
    delta = methods.SIS_SENSITIVITY[relation]

    def set_law(xx: np.ndarray, yy: np.ndarray, sens: float) -> dict[frozenset[int], float]:
        out: dict[frozenset[int], float] = {}
        for s, p in slate_probabilities("clm", methods.sis_scores(xx, yy), np.full(4, sens), eps, k).items():
            out[frozenset(s)] = out.get(frozenset(s), 0.0) + p
        return out

    def worst(sens: float) -> float:
        base = set_law(x, y, sens)
        grid = [-1.0, 1.0]
        return max(
            abs(math.log(base[s]) - math.log(p))
            for x2, y2, _ in _neighbours(x, y, [np.arange(3)], relation, grid)
            for s, p in set_law(x2, y2, sens).items()
        )

    # within ε, and not vacuously: these neighbours spend a quarter of ε or more
    assert 0.25 * eps <= worst(delta) <= eps + 1e-9


def test_private_top_k_is_clms_slate_on_the_clipped_scores() -> None:
    scores = np.array([3.0, 0.5, 7.5, 2.0, 9.0, 1.0])  # 9 > the bound 8: clipped first
    got = methods.private_top_k(scores, 8.0, 2.0, 1.5, 3, np.random.default_rng(5), params={"loss_weight": 0.3})
    clipped = np.minimum(scores, 8.0)
    want = select_slate("clm", clipped, np.full(6, 2.0), 1.5, 3, np.random.default_rng(5), loss_weight=0.3)
    assert got.tolist() == sorted(want.tolist())


def _planted(seed: int) -> data.Dataset:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((100, 12))
    y = x[:, [2, 5, 9]] @ np.array([3.0, -3.0, 3.0]) + rng.normal(0, 0.3, 100)
    return data.Dataset("planted", x, y, np.array([2, 5, 9]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sis_and_two_stage_recover_a_planted_support(seed) -> None:
    ds = _planted(seed)
    rng = np.random.default_rng(seed)
    x, y = data.max_abs(ds.x, ds.y)
    xs, ys = data.standardised(ds.x, ds.y)
    assert methods.top_k(methods.sis_scores(x, y), 3, rng).tolist() == [2, 5, 9]
    counts = methods.support_counts(xs, ys, methods.blocks(100, rng), 0.1)
    assert counts[[2, 5, 9]].min() >= 7 > np.delete(counts, [2, 5, 9]).max()
    assert methods.top_k(counts, 3, rng).tolist() == [2, 5, 9]
    assert methods.lasso_reference(xs, ys, 3, 0.1).tolist() == [2, 5, 9]
    # at a large ε the private selections are the non-private ones
    sel = methods.private_top_k(methods.sis_scores(x, y), 100.0, 1.0, 2000.0, 3, rng)
    assert sel.tolist() == [2, 5, 9]
    assert methods.private_top_k(counts, 10.0, 1.0, 2000.0, 3, rng).tolist() == [2, 5, 9]


def test_non_private_top_k_breaks_ties_at_random() -> None:
    counts = np.array([2.0, 2.0, 2.0, 2.0, 5.0])
    firsts = [methods.top_k(counts, 2, np.random.default_rng(s)).tolist() for s in range(200)]
    assert all(f[1] == 4 for f in firsts)
    share = np.bincount([f[0] for f in firsts], minlength=4)[:4] / 200
    assert share.min() > 0.15  # each tied feature is chosen about a quarter of the time


def test_classes_and_accuracy_on_hand_made_selections() -> None:
    scores = np.array([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5])  # rank = index
    assert metrics.class_bounds("TOP", 5) == (5, 5)
    assert metrics.class_bounds("GREAT", 5) == (1, 6)
    assert metrics.class_bounds("GOOD", 5) == (1, 8)
    sel = np.array([[0, 1, 2, 3, 4], [0, 1, 2, 3, 5], [0, 1, 2, 3, 7], [1, 2, 3, 4, 5]])
    got = metrics.rank_classes(sel, scores, 5)
    assert got["TOP"].tolist() == [True, False, False, False]
    assert got["GREAT"].tolist() == [True, True, False, False]
    assert got["GOOD"].tolist() == [True, True, True, False]  # the last misses the top 1
    assert metrics.accuracy(sel, np.array([0, 5, 7]), 5).tolist() == [0.2, 0.4, 0.4, 0.2]
    rate, lo, hi = metrics.rate_interval(np.array([True] * 3 + [False] * 7))
    assert rate == 0.3 and lo == pytest.approx(0.0667395, abs=1e-6) and hi == pytest.approx(0.6524529, abs=1e-6)
    assert metrics.compare(np.array([1.0, 0.9, 1.0, 0.95]), np.array([0.2, 0.3, 0.25, 0.2]))[0] == 1
    assert metrics.compare(np.full(5, 0.5), np.full(5, 0.5)) == (0, 1.0)
    assert metrics.compare(np.array([0.5, 0.6, 0.4]), np.array([0.6, 0.4, 0.5]))[0] == 0


def test_the_lars_lasso_has_the_supports_of_coordinate_descent_run_to_convergence() -> None:
    from sklearn.linear_model import Lasso

    ds = data.fan_lv(np.random.default_rng(6), shape=(40, 300), nonzero=5)
    xs, ys = data.standardised(ds.x, ds.y)
    for rows in [*methods.blocks(40, np.random.default_rng(7)), np.arange(40)]:
        tight = Lasso(alpha=0.1, tol=1e-12, max_iter=200_000).fit(xs[rows], ys[rows]).coef_
        lars = methods.lasso_coef(xs[rows], ys[rows], 0.1)
        assert np.flatnonzero(lars).tolist() == np.flatnonzero(tight).tolist()
        assert np.abs(lars - tight).max() < 1e-6
