"""The gem/mgem peel's byte-first race (recsvc/mechanisms/gem_peel_race.py): chosen words that
put a candidate far beyond any float noise bound ahead, a wrong pruning table that loses it,
the refill and hull-deletion paths against the exact peeled law."""

import numpy as np
import pytest

from recsvc.mechanisms import gem, gem_peel, gem_peel_race, slate_probabilities
from recsvc.mechanisms.testing import Words, chisquare_pvalue
from recsvc.rng import csprng

ALPHA = 1e-3
BETA = {"beta": 0.05}


def _far_behind_words() -> list[int]:
    """Two candidates, the second's a = −60: T's byte 255 (E_T ≤ ln(256/255)), the second's byte
    0 and every later bit of its uniform 0 (U < 2⁻¹¹⁷, E > 81), so it wins."""
    n_pool = gem_peel.pool_size(2, 1)
    block = 255  # candidate 0's byte is the word's low byte (the block is read as uint8)
    pool = [2**63] + [0] * (n_pool - 1)  # C = [T, 1]: T's cell, then the second's
    slow = [2**63, 0]  # the decimal round's 64 more bits: T's, then the second's
    return [block, *pool, *slow]


def _far_behind_input() -> tuple[np.ndarray, np.ndarray, float]:
    eps = 1.0
    q = np.array([0.0, -240.0])  # q'_1 = −120: a_1 = q'_1·ε/2 = −60
    return q, np.ones(2), eps


def test_a_candidate_60_behind_wins_on_words_near_zero(monkeypatch):
    """Its cell at 0 leaves the floats undecided: the decimal slow path decides, once."""
    q, d, eps = _far_behind_input()
    assert gem.GemUtilities(q, d, eps, gem.gem_t(2, eps, 0.05)).value[1] == pytest.approx(-60.0)
    calls = []
    decide = gem_peel._decide
    monkeypatch.setattr(gem_peel, "_decide", lambda *a: calls.append(a[4].tolist()) or decide(*a))
    slate = gem_peel.gem_peel(q, d, eps, BETA, Words(_far_behind_words(), then=2**63), 1)
    assert slate.tolist() == [1]
    assert calls == [[0, 1]]  # C = [T, the second]


def test_a_pruning_table_without_the_first_cells_infinity_loses_it(monkeypatch):
    """The cell [0, 1/256) bounded by ln 256 as if E stopped there: the second is pruned."""
    q, d, eps = _far_behind_input()
    wrong = gem_peel_race.UP.copy()
    wrong[0] = np.log(256.0)
    monkeypatch.setattr(gem_peel_race, "UP", wrong)
    slate = gem_peel.gem_peel(q, d, eps, BETA, Words(_far_behind_words(), then=2**63), 1)
    assert slate.tolist() == [0]


def _counts(name: str, q: np.ndarray, d: np.ndarray, eps: float, k: int, draws: int, rng) -> float:
    p = slate_probabilities(name, q, d, eps, k)
    outcomes = list(p)
    index = {s: i for i, s in enumerate(outcomes)}
    peel = gem_peel.gem_peel if name == "gem" else gem_peel.mgem_peel
    counts = np.zeros(len(outcomes))
    for _ in range(draws):
        counts[index[tuple(peel(q, d, eps / k, BETA, rng, k).tolist())]] += 1
    return chisquare_pvalue(counts, np.array([p[s] for s in outcomes]))


@pytest.mark.parametrize("name", ["gem", "mgem"])
def test_slates_follow_the_peeled_law_when_every_refill_is_needed(monkeypatch, name):
    """A pool of one word: every step with two candidates or more asks for more words."""
    monkeypatch.setattr(gem_peel, "pool_size", lambda n, k: 1)
    draws = []
    words = gem_peel.uniform_words
    monkeypatch.setattr(gem_peel, "uniform_words", lambda rng, size: draws.append(size) or words(rng, size))
    q = np.array([0.3, 1.0, -0.5, 0.8, 0.1, 0.9])
    d = np.array([0.5, 2.0, 0.2, 1.0, 0.7, 1.4])
    assert _counts(name, q, d, 6.0 if name == "gem" else 60.0, 3, 3_000, csprng()) > ALPHA
    assert len(draws) > 1.2 * 3_000  # one draw a slate, and refills


def test_slates_follow_the_peeled_law_when_inner_hull_vertices_win():
    """Points on a concave arc: all of them hull vertices, the winners mostly inner ones."""
    x = np.linspace(0.2, 2.0, 6)
    d = x.copy()
    q = -((x - 1.1) ** 2) * 0.5 + 0.1 * x
    assert _counts("mgem", q, d, 30.0, 3, 3_000, np.random.default_rng(11)) > ALPHA


def test_dropping_a_vertex_gives_the_survivors_hull():
    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(3, 200))
        q, d, t = rng.normal(size=n), rng.uniform(0.05, 2.0, n), float(rng.normal() * 50)
        s = q - t * d
        vertices = gem.hull_vertices(s, d)
        w = int(vertices[rng.integers(0, vertices.shape[0])]) if trial % 2 else int(rng.integers(0, n))
        after, known = gem_peel_race._without(s, d, vertices, w)
        order = np.r_[np.arange(w), n - 1, np.arange(w + 1, n - 1)] if w < n - 1 else np.arange(n - 1)
        if known:  # the survivors as _drop leaves them: the last one in w's place
            assert after.tolist() == gem.hull_vertices(s[order].copy(), d[order].copy()).tolist()
