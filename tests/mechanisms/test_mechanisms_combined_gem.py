"""combined_gem's batch sampler (select_batch's path) decides every trial as the real numbers do:
driven with chosen words, each trial's reported bit is [U < 1/(1 + e^{−ε_c})] and its output the
argmax of the real a_i − ln U_i on mgem's or gem's q', computed here in 80-digit decimal; each row
is the same function of its user's stream as the one-user sampler."""

from __future__ import annotations

import decimal
from decimal import Decimal

import numpy as np
import pytest

import recsvc.mechanisms.gem_combined as gc
from recsvc.mechanisms import probabilities, select_batch
from recsvc.mechanisms.gem import GemUtilities, checked_t, correlation_bit, correlation_split
from recsvc.mechanisms.testing import Words, chisquare_pvalue
from recsvc.rng import user_stream

WORD = 2**64
CTX = decimal.Context(prec=80, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)
P = {"beta": 0.05, "corr_budget_fraction": 0.6}
EPS = 10.0


def _uniform(word: int) -> Decimal:
    """U from its first word's top 53 bits, then the word 1 forever: x + 2⁻¹¹⁷/(1 − 2⁻⁶⁴)."""
    return CTX.add(CTX.divide(word >> 11, Decimal(2**53)), CTX.divide(Decimal(2) ** -117, 1 - Decimal(2) ** -64))


def _real_a(q: np.ndarray, d: np.ndarray, eps_g: float, t: float) -> list[Decimal]:
    """a_i = q'_i·ε_g/2 on the reals, q'_i = min_j (s_i − s_j)/(Δ_i + Δ_j), s = q − tΔ."""
    s = [
        CTX.subtract(Decimal(float(a)), CTX.multiply(Decimal(t), Decimal(float(b)))) for a, b in zip(q, d, strict=True)
    ]
    dd = [Decimal(float(b)) for b in d]
    half = CTX.divide(Decimal(eps_g), 2)
    return [
        CTX.multiply(min(CTX.divide(CTX.subtract(s[i], s[j]), CTX.add(dd[i], dd[j])) for j in range(len(s))), half)
        for i in range(len(s))
    ]


def _real_outputs(q: np.ndarray, d: np.ndarray, words: list[int], size: int, eps: float = EPS) -> list[int]:
    """Each trial's output on the reals, reading the words as the sampler's docstring orders them:
    the bits' uniforms, then one cell per candidate for each 1-report, then for each 0-report."""
    eps_c, eps_g = correlation_split(P).stage_epsilons(eps)
    t = checked_t(q, d, eps_g, P["beta"])
    keep_p = CTX.divide(1, CTX.add(1, CTX.exp(-Decimal(eps_c))))
    b = correlation_bit(q, d)
    reported = [b if _uniform(w) < keep_p else 1 - b for w in words[:size]]
    a = {1: _real_a(q, d, eps_g, -t), 0: _real_a(q, d, eps_g, t)}
    order = [j for j in range(size) if reported[j]] + [j for j in range(size) if not reported[j]]
    n, out = q.shape[0], [0] * size
    for r, j in enumerate(order):
        cells = words[size + r * n : size + (r + 1) * n]
        v = [CTX.subtract(ai, CTX.ln(_uniform(w))) for ai, w in zip(a[reported[j]], cells, strict=True)]
        out[j] = max(range(n), key=lambda i: v[i])
    return out


def _rows(q: np.ndarray, size: int, users: int, eps: float = EPS) -> list[list[int]]:
    """Per user: the bits' words (random, and at the keep probability's cell), then the cells:
    random, with a candidate far behind given the cell at 0 in some trials (its real noise,
    ≈ 81, wins where a float sampler's, capped at 36.7, cannot; the race's slow path decides it)."""
    rng = np.random.default_rng(36)
    eps_c, _ = correlation_split(P).stage_epsilons(eps)
    mark = int(CTX.multiply(CTX.divide(1, CTX.add(1, CTX.exp(-Decimal(eps_c)))), 2**53))
    low = int(np.argmin(q))
    rows = []
    for u in range(users):
        bits = rng.integers(0, WORD, size, dtype=np.uint64).tolist()
        # one cell either side of the threshold's (at a huge ε_c the threshold is the top cell)
        bits[0], bits[1] = (mark - 1) << 11, min((mark + 1) << 11, WORD - 1)
        cells = rng.integers(0, WORD, size * q.shape[0], dtype=np.uint64).tolist()
        for r in range(u % 2, size, 2):
            cells[r * q.shape[0] + low] = 0
        rows.append(bits + cells)
    return rows


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    q = np.array([0.0, -0.4, -60.0, 0.3, -1.1])  # candidate 2 is ~30 noise scales behind
    d = np.array([1.0, 1.5, 2.0, 1.2, 0.8])
    return q, d


@pytest.mark.parametrize("eps", [1e-3, 1.0, EPS, 1e6, 6e304])  # 6e304: near the largest these inputs accept
def test_the_batch_decides_every_trial_as_the_real_numbers_do(eps: float) -> None:
    q, d = _inputs()
    size, users = 6, 4
    rows = _rows(q, size, users, eps)
    qb, db = np.tile(q, (users, 1)), np.broadcast_to(d, (users, q.shape[0]))
    got = gc.combined_gem_batch(qb, db, eps, P, lambda b: Words(list(rows[b]), then=1), size)  # type: ignore[arg-type, return-value]  # a stand-in
    want = [_real_outputs(q, d, rows[b], size, eps) for b in range(users)]
    assert got.tolist() == want
    if eps == EPS:  # the far candidate wins on the reals somewhere, beyond any float noise's reach
        assert any(2 in row for row in want)


def test_a_sampler_with_the_float_noise_is_caught() -> None:
    """The same audit fails a deliberately wrong race: the float sampler's noise, −ln max(x, 2⁻⁵³)."""
    q, d = _inputs()
    size, users = 6, 4
    rows = _rows(q, size, users)
    qb, db = np.tile(q, (users, 1)), np.broadcast_to(d, (users, q.shape[0]))

    def float_races(qq: np.ndarray, dd: np.ndarray, t: float, eps_g: float, x: np.ndarray, n1: int) -> np.ndarray:
        out = np.empty(x.shape[0], dtype=np.int64)
        for r in range(x.shape[0]):
            a = GemUtilities(qq, dd, eps_g, -t if r < n1 else t).value
            out[r] = int(np.argmax(a - np.log(np.maximum(x[r], 2.0**-53))))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gc, "_races", float_races)
        got = gc.combined_gem_batch(qb, db, EPS, P, lambda b: Words(list(rows[b]), then=1), size)  # type: ignore[arg-type, return-value]  # a stand-in
    want = [_real_outputs(q, d, rows[b], size) for b in range(users)]
    assert got.tolist() != want


@pytest.mark.parametrize("shared", [True, False])
def test_each_batch_row_is_the_one_user_sampler_on_its_stream(shared: bool) -> None:
    """Row b of select_batch is combined_gem's sample on user_stream(seed, offset + b), whether Δ
    is shared or per user; a chunk of users gives the rows of the whole batch."""
    rng = np.random.default_rng(5)
    q = rng.normal(size=(7, 40))
    d = rng.uniform(0.5, 1.0, 40) if shared else rng.uniform(0.5, 1.0, (7, 40))
    whole = select_batch("combined_gem", q, d, 1.0, 9, 3, corr_budget_fraction=0.3)
    dd = np.broadcast_to(d, q.shape)
    for b in range(7):
        one = gc.combined_gem_sample(
            q[b], dd[b], 1.0, {"beta": 0.05, "corr_budget_fraction": 0.3}, user_stream(3, b), 9
        )
        np.testing.assert_array_equal(whole[b], one)
    chunk = select_batch(
        "combined_gem", q[3:], d if shared else d[3:], 1.0, 9, 3, user_offset=3, corr_budget_fraction=0.3
    )
    np.testing.assert_array_equal(chunk, whole[3:])


def test_the_batch_follows_the_exact_law() -> None:
    """Counts over many users' streams match the exact mixture law (chi-square)."""
    q, d = np.array([0.2, 0.5, 0.1, 0.9, 0.7, 0.4]), np.array([1.0, 0.6, 0.8, 0.9, 0.5, 0.7])
    out = select_batch("combined_gem", np.tile(q, (200, 1)), d, 3.0, 100, 11)
    counts = np.bincount(out.ravel(), minlength=6)
    assert counts.sum() == 20_000
    assert chisquare_pvalue(counts, probabilities("combined_gem", q, d, 3.0)) > 1e-3
