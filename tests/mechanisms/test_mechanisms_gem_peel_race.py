"""The gem/mgem peel's byte-first race (recsvc/mechanisms/gem_peel_race.py): chosen words that
put a candidate far beyond any float noise bound ahead, a wrong pruning table that loses it,
the refill and hull-deletion paths against the exact peeled law."""

import decimal

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


def _pruned_are_behind(q: np.ndarray, d: np.ndarray, eps: float, t: float, bytes_: np.ndarray, up: np.ndarray) -> int:
    """Runs the byte pass and checks in decimal that each candidate it drops is certainly behind
    T: a_a + ln(256/k_a) < a_T + ln(256/(k_T + 1)) on the real a. Returns how many it dropped."""
    s = q - t * d
    top = int(np.argmax(s))
    r = float(np.abs(q).max()) / float(d.min()) + abs(t)
    err = 4.1 * 2.0**-53 * r * eps * 0.5 * (1.0 + 4.0 * 2.0**-53) + 2.0**-1060
    cand = np.empty(q.shape[0], np.int64)
    c = gem_peel_race._candidates(s, d, top, eps * 0.5, err, bytes_, up, gem_peel_race.LOW, cand)
    dropped = sorted(set(range(q.shape[0])) - set(cand[:c].tolist()))
    if not dropped:
        return 0
    a = gem.GemUtilities(q, d, eps, t, s=s)
    ctx = decimal.Context(prec=60)
    enc = a.exact([top, *dropped], 60)
    floor = enc[0][0] + ctx.ln(ctx.divide(256, int(bytes_[top]) + 1))
    for (_, hi), j in zip(enc[1:], dropped, strict=True):
        assert bytes_[j] > 0, j  # the cell [0, 1/256) has E unbounded
        assert hi + ctx.ln(ctx.divide(256, int(bytes_[j]))) < floor, j
    return len(dropped)


@pytest.mark.parametrize("gap", [-1e-9, -1e-11, -1e-13, -1e-15, 0.0, 1e-15, 1e-13, 1e-9])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_candidate_at_the_pruning_threshold_is_dropped_only_when_certainly_behind(gap, sign):
    """Two candidates, the second's a + ln(256/k) set `gap` above T's ln(256/(k_T + 1)): it may be
    dropped only when it is certainly behind (decimal), and is dropped at 10⁻⁹ behind."""
    eps, k_top, k_other = 0.7, 200, 3
    d = np.array([0.4, 1.3])
    t = sign * gem.gem_t(2, eps, 0.05)
    target = np.log(256.0 / (k_top + 1)) - np.log(256.0 / k_other) + gap  # the second's a
    q0 = 1.0
    s_top = q0 - t * d[0]
    q = np.array([q0, s_top + target / (eps / 2) * (d[0] + d[1]) + t * d[1]])
    bytes_ = np.array([k_top, k_other], dtype=np.uint8)
    dropped = _pruned_are_behind(q, d, eps, t, bytes_, gem_peel_race.UP)
    if gap <= -1e-9:
        assert dropped == 1
    if gap >= 1e-13:
        assert dropped == 0


def test_every_dropped_candidate_is_certainly_behind_and_a_wrong_table_drops_some_that_are_not():
    rng = np.random.default_rng(21)
    wrong = gem_peel_race.LOW.copy()  # each cell's lower end for its upper bound: unsound
    dropped, violations = 0, 0
    for trial in range(60):
        n = int(rng.integers(2, 30))
        scale = 10.0 ** rng.uniform(-3, 3)
        q, d = rng.normal(size=n) * scale, 10.0 ** rng.uniform(-2, 1, n)
        eps = 10.0 ** rng.uniform(-1, 2)
        t = (1.0 if trial % 2 else -1.0) * gem.gem_t(n, eps, 0.05)
        bytes_ = rng.integers(0, 256, n).astype(np.uint8)
        dropped += _pruned_are_behind(q, d, eps, t, bytes_, gem_peel_race.UP)
        try:
            _pruned_are_behind(q, d, eps, t, bytes_, wrong)
        except AssertionError:
            violations += 1
    assert dropped > 100
    assert violations > 0
