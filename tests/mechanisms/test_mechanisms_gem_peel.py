"""gem and mgem slates peeled natively (recsvc/mechanisms/gem_peel.py): whole slates against their
exact peeled law (the upper hull carried over between steps, each step an exact race), and the
work estimate."""

import numpy as np
import pytest

from recsvc.mechanisms import select_slate, slate_probabilities
from recsvc.mechanisms.gem_peel import BYTE_WORDS, PASS_COST
from recsvc.mechanisms.slate import native_peel_work
from recsvc.mechanisms.testing import chisquare_pvalue
from recsvc.rng import csprng

ALPHA = 1e-3


@pytest.mark.parametrize(("name", "eps"), [("gem", 2.0), ("mgem", 40.0)])
def test_native_slates_follow_the_exact_peeled_law(name, eps):
    q = np.array([0.3, 1.0, -0.5, 0.8, 0.1])
    d = np.array([0.5, 2.0, 0.2, 1.0, 0.7])
    p = slate_probabilities(name, q, d, eps, 3)
    outcomes = list(p)
    index = {s: i for i, s in enumerate(outcomes)}
    rng = np.random.default_rng(17)
    counts = np.zeros(len(outcomes))
    for _ in range(4_000):  # each step a Python-level exact race: ~0.15 ms
        counts[index[tuple(select_slate(name, q, d, eps, 3, rng).tolist())]] += 1
    assert chisquare_pvalue(counts, np.array([p[s] for s in outcomes])) > ALPHA


def test_a_winning_hull_vertex_rebuilds_the_hull():
    """Points whose top few are all hull vertices: every step removes a vertex, and the slates
    still follow the peeled law (the rebuilt hull is the survivors')."""
    q = np.array([2.0, 1.9, 1.8, -3.0, -3.1])
    d = np.array([0.1, 1.0, 3.0, 0.5, 2.0])
    p = slate_probabilities("mgem", q, d, 6.0, 3)
    outcomes = list(p)
    index = {s: i for i, s in enumerate(outcomes)}
    rng = np.random.default_rng(5)
    counts = np.zeros(len(outcomes))
    for _ in range(3_000):
        counts[index[tuple(select_slate("mgem", q, d, 6.0, 3, rng).tolist())]] += 1
    assert chisquare_pvalue(counts, np.array([p[s] for s in outcomes])) > ALPHA


def test_catalog_scale_slates_are_distinct_and_favour_the_top():
    """n = 5,000 at ε = 10⁶: t ≈ 0, so each step's sure winner is the survivors' top score. The
    race draws from the service's own generator (ChaCha20) as from numpy's."""
    rng = np.random.default_rng(8)
    q, d = rng.uniform(0, 1, 5000), rng.uniform(0.01, 0.05, 5000)
    slate = select_slate("mgem", q, d, 1e6, 5, csprng())
    assert slate.tolist() == np.argsort(-q)[:5].tolist()


def test_the_work_estimate_is_a_byte_and_the_passes_per_candidate_and_step():
    n, k = 4000, 10
    d = np.full(n, 0.02)
    assert native_peel_work("mgem", np.zeros(n), d, 1.0, k, {}) == pytest.approx(k * n * (BYTE_WORDS + PASS_COST))
    assert native_peel_work("gem", np.zeros(n), d, 1.0, k, {}) == pytest.approx(k * n * (BYTE_WORDS + PASS_COST))
    assert native_peel_work("mgem", np.zeros(n), d, 1.0, 1, {}) is None  # k = 1 is select's own draw
    assert native_peel_work("rnm", np.zeros(n), d, 1.0, k, {}) is None
