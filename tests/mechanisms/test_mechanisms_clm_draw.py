"""clm's draw from the classes that can win (recsvc/mechanisms/clm_draw.py): the same law as the
exhaustive draw, checked against clm's exact class law, its direct definition over all subsets,
and the exhaustive sampler at sizes too large to enumerate; exact on the reals: the slow path
(recsvc/mechanisms/clm_resolve.py) decides every comparison the same way, and a gap beyond any
float noise bound is reached."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from recsvc.mechanisms import MECHANISMS, check_params, clm_resolve, select_slate
from recsvc.mechanisms.clm import _negative_noise, _ranks, class_log_probabilities, class_of, classes
from recsvc.mechanisms.clm_draw import RAW_FOR_CLASS, RAW_PER_ITEM, _run, _slate_kernel, draw_subset, lgammas
from recsvc.mechanisms.clm_tape import OutOfRandomness, _cell, below, log_size_bounds, phi
from recsvc.mechanisms.testing import Words, chisquare_pvalue, clm_direct_log_probabilities, clm_direct_sample

ALPHA = 1e-3


def test_phi_is_its_own_inverse_across_the_range_the_draw_meets():
    for s in (1e-300, 1e-20, 1e-3, 0.5, 0.7, 1.0, 5.0, 30.0, 300.0):
        assert phi(phi(s)) == pytest.approx(s, rel=1e-9)


@pytest.mark.parametrize(
    "n, k, eps, gamma",
    [(7, 3, 1.0, 0.5), (7, 2, 4.0, 0.0), (6, 3, 0.3, 1.0), (8, 3, 8.0, 0.5), (7, 2, 30.0, 0.5)],
)
def test_the_winning_class_follows_clms_exact_class_law(n, k, eps, gamma):
    rng = np.random.default_rng(n * 100 + k)
    q, d = rng.normal(size=n), rng.uniform(0.2, 1.0, n)
    p = check_params({"loss_weight": gamma}, MECHANISMS["clm"])
    order, ht, log_p = class_log_probabilities(q, d, eps, p, k)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(1, n + 1)
    index = {(int(h), int(t)): i for i, (h, t) in enumerate(ht)}
    counts = np.zeros(len(ht))
    for _ in range(3000):
        chosen = select_slate("clm", q, d, eps, k, rng, loss_weight=gamma)
        counts[index[class_of(sorted(int(rank[a]) for a in chosen), k)]] += 1
    probs = np.exp(log_p)
    assert chisquare_pvalue(counts, probs / probs.sum()) > ALPHA


def test_clm_top_k_by_the_poisson_draw_matches_the_direct_definition():
    q = np.array([0.3, 1.0, -0.5, 0.8, 0.1, 0.45])
    d = np.array([0.5, 2.0, 0.2, 1.0, 0.7, 0.4])
    rng = np.random.default_rng(8)
    direct = Counter(clm_direct_sample(q, d, 3.0, 3, 0.5, rng, 4000))
    native = Counter(tuple(sorted(select_slate("clm", q, d, 3.0, 3, rng).tolist())) for _ in range(4000))
    subsets = list(itertools.combinations(range(6), 3))
    table = np.array([[direct[s] for s in subsets], [native[s] for s in subsets]], dtype=float)
    pooled = table.sum(axis=0) / table.sum()
    assert chisquare_pvalue(table[1], pooled) > ALPHA and chisquare_pvalue(table[0], pooled) > ALPHA


def test_ties_follow_the_direct_definitions_exact_law_in_the_poisson_draw():
    q = np.array([0.5, 0.5, 0.2, 0.5, 0.1, 0.2])  # ties: ranks need the stable order
    d = np.full(6, 0.25)
    rng = np.random.default_rng(9)
    law = clm_direct_log_probabilities(q, d, 2.0, 2, 0.3)
    got = Counter(tuple(sorted(select_slate("clm", q, d, 2.0, 2, rng, loss_weight=0.3).tolist())) for _ in range(3000))
    subsets = list(law)
    assert chisquare_pvalue(np.array([got[s] for s in subsets]), np.exp([law[s] for s in subsets])) > ALPHA


def test_the_poisson_draw_agrees_with_every_classs_noise_on_a_catalog_too_large_to_enumerate():
    """n = 300, k = 40: 10,441 classes. The slates against the exhaustive draw (each class's best
    noise from one uniform, the winner their argmax): two-sample χ² on the winner's h and on deciles
    of its t."""
    rng = np.random.default_rng(3)
    n, k, eps = 300, 40, 2.0
    q, d = rng.normal(size=n), rng.uniform(0.05, 1.0, n)
    rank = np.empty(n, np.int64)
    rank[np.argsort(-q, kind="stable")] = np.arange(1, n + 1)

    def summary(h: int, t: int) -> tuple[int, int]:
        return min(h, 3), t * 10 // (n + 1)  # head length (3: three or more), worst rank's decile

    def class_of_slate(chosen: np.ndarray) -> tuple[int, int]:
        r = np.sort(rank[chosen])
        return (int(np.argmin(r == np.arange(1, k + 1))) if r[-1] > k else k), int(r[-1])

    draws = 1500
    ht, log_size, loss = classes(np.sort(q)[::-1] / d.max(), k, 0.5)
    best = (loss * (-0.5 * eps) - _negative_noise(log_size, rng.random((draws, loss.shape[0])))).argmax(axis=1)
    exhaustive = Counter(summary(k if c == 0 else int(ht[c, 0]), int(ht[c, 1])) for c in best)
    poisson = Counter(summary(*class_of_slate(select_slate("clm", q, d, eps, k, rng))) for _ in range(draws))
    cells = sorted(set(exhaustive) | set(poisson))
    table = np.array([[exhaustive[c] for c in cells], [poisson[c] for c in cells]], dtype=float)
    pooled = table.sum(axis=0) / table.sum()
    assert len(cells) > 3  # the summary really varies
    assert chisquare_pvalue(table[1], pooled) > ALPHA and chisquare_pvalue(table[0], pooled) > ALPHA


def test_raw_draws_become_uniform_cells_and_exact_integers():
    raw = np.array([0, 2**64 - 1, 0, 1, 4, 2**64 - 1], dtype=np.uint64)
    cur = np.zeros(1, np.int64)
    assert _cell(raw, 0) == (0.0, 2.0**-53) and _cell(raw, 1) == (1.0 - 2.0**-53, 1.0)  # U's first 53 bits
    cur[0] = 2
    # 2⁶⁴ mod 3 = 1: raw 0 is rejected (else residue 0 would come up once more than 1 and 2)
    assert below(3, raw, cur) == 1 and int(cur[0]) == 4
    assert below(3, raw, cur) == 4 % 3
    below(2, raw, cur)
    with pytest.raises(OutOfRandomness):
        below(2, raw, cur)


@pytest.mark.parametrize(
    "q", [np.random.default_rng(4).normal(size=300), np.round(np.random.default_rng(4).normal(size=300))]
)
def test_a_kernel_that_runs_out_of_raw_draws_gives_what_one_long_block_gives(q: np.ndarray):
    """Restarting on the same draws plus fresh ones is one run on the longer sequence: a block of
    one draw, extended by doubling, gives exactly the slate of a block of 10,000 (distinct scores
    and ties, which take the members from the order)."""
    d = np.full(q.shape[0], 0.5)
    xs, order = _ranks(q)
    assert (order.shape[0] > 0) == (np.unique(q).shape[0] < q.shape[0])
    for k, eps in ((10, 1.0), (40, 8.0), (1, 3.0)):
        inputs = (xs, eps, d, 0.5, k)
        args = (q, d, xs, order, lgammas(q.shape[0]), k, eps, 0.5, 0.0)
        for seed in range(20):
            short, long = np.random.default_rng(seed), np.random.default_rng(seed)
            got = _run(short, short.bit_generator.random_raw(1), inputs, _slate_kernel, args)
            want = _run(long, long.bit_generator.random_raw(10_000), inputs, _slate_kernel, args)
            assert got.tolist() == want.tolist()


def _subset(q: np.ndarray, d: np.ndarray, k: int, eps: float, gamma: float, rng, slack: float = 0.0) -> list[int]:
    xs, order = _ranks(q)
    return draw_subset(q, d, xs, order, k, eps, gamma, rng, slack=slack).tolist()


_SLOW_CASES = [
    (np.random.default_rng(1).normal(size=6), np.random.default_rng(2).uniform(0.2, 1.0, 6), 2, 3.0, 0.5),
    (np.array([0.5, 0.5, 0.2, 0.5, 0.1, 0.2]), np.full(6, 0.25), 3, 2.0, 0.3),  # ties
    (np.random.default_rng(3).normal(size=40) * 1e6, np.geomspace(1e-3, 1e3, 40), 4, 1e-3, 0.0),  # Δ over 6 decades
    (np.random.default_rng(4).normal(size=12), np.full(12, 1.0), 3, 200.0, 1.0),  # gaps far beyond float noise
]


@pytest.mark.parametrize("case", range(len(_SLOW_CASES)))
def test_the_slow_path_decides_every_comparison_as_the_float_enclosures_do(case: int):
    """With ``slack`` = ∞ every comparison goes to clm_resolve's decimal enclosures: the same words
    give the same subset as the float path (both compute the real-number algorithm's output)."""
    q, d, k, eps, gamma = _SLOW_CASES[case]
    for seed in range(25):
        fast = _subset(q, d, k, eps, gamma, np.random.default_rng(seed))
        slow = _subset(q, d, k, eps, gamma, np.random.default_rng(seed), slack=math.inf)
        assert slow == fast


def test_a_wrong_slow_path_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The comparison above has teeth: a resolver that flips its answers changes the subsets."""
    q, d, k, eps, gamma = _SLOW_CASES[0]
    fast = [_subset(q, d, k, eps, gamma, np.random.default_rng(s)) for s in range(25)]
    right = clm_resolve.Resolver.less
    monkeypatch.setattr(clm_resolve.Resolver, "less", lambda self, *a: not right(self, *a))
    wrong = [_subset(q, d, k, eps, gamma, np.random.default_rng(s), slack=math.inf) for s in range(25)]
    assert wrong != fast


def test_a_gap_beyond_any_float_noise_bound_is_chosen_when_the_real_noise_reaches_it():
    """Float64 exponential noise never exceeds 44.4, so a float sampler can never pick a class 60
    below the top one. Here the rectangle's exponential is a uniform whose first 64 bits are all
    ones (then one more word of ones): its real noise is ~88, the slow path sees it, and the subset
    {best, third} (utility −60 against the top pair's 0) wins."""
    q, d = np.array([0.0, -1.0, -121.0]), np.ones(3)
    half = 2**63
    block = [0, 2**64 - 1, 1, half, half, half, half] + [half] * (RAW_FOR_CLASS + RAW_PER_ITEM * 2 - 7)
    words = Words([*block, half, 2**64 - 1], then=half)  # the uniforms' next 64 bits: U_0's, U_1's
    got = _subset(q, d, 2, 2.0, 0.5, words)
    assert sorted(got) == [0, 2]
    # the same first 64 bits with the rest of U_1 in the middle: its noise is ~46, the top pair wins
    words = Words([*block, half, half], then=half)
    assert sorted(_subset(q, d, 2, 2.0, 0.5, words)) == [0, 1]


def test_lgamma_of_integers_is_within_the_bound_the_enclosures_assume():
    """log C(t − h − 2, k − h − 1) from three lgammas against the exact binomial, across the sizes
    served (n up to 20,720, k up to 500)."""
    rng = np.random.default_rng(6)
    for _ in range(400):
        k = int(rng.integers(2, 501))
        t = int(rng.integers(k + 1, 20_721))
        h = int(rng.integers(0, k))
        lo, hi = log_size_bounds(lgammas(20_720), k, h, t)
        exact = math.log(math.comb(t - h - 2, k - h - 1))  # math.log of an int: within an ulp
        assert lo <= exact <= hi
        assert hi - lo < 1e-6 * (abs(exact) + 1)
