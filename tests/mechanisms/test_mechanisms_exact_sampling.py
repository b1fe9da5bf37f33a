"""em and krr sample exactly: a float-level audit with controlled 64-bit words shows their output
follows the exact law (δ = 0 at every ε), where inverse-CDF sampling on float64 had δ > 0."""

from __future__ import annotations

import bisect
import decimal
from decimal import Decimal

import numpy as np
import pytest

from recsvc.mechanisms import log_probabilities, probabilities
from recsvc.mechanisms.exact_sampling import em_exact_sample, krr_exact_sample
from recsvc.mechanisms.testing import Words, delta, float_grid_law

N = 500
WORD = 2**64
CTX = decimal.Context(prec=80, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores spread over 900 noise scales at ε = 30 (so most outcomes are far below 2⁻⁵³), and a
    neighbour moved by ±Δ."""
    rng = np.random.default_rng(7)
    q = rng.random(N)
    d = np.full(N, 1.0 / 60)
    q2 = q + np.where(rng.random(N) < 0.5, 1.0, -1.0) * d
    return q, d, q2


def _em_boundaries(q: np.ndarray, d: np.ndarray, eps: float) -> list[Decimal]:
    """The exact S_a / S (a = 0..n−1) of P(a) ∝ exp(ε (q_a − q*) / (2Δmax)), to 80 digits."""
    top, scale = Decimal(float(q.max())), CTX.divide(Decimal(eps), 2 * Decimal(float(d.max())))
    cum, total = [], Decimal(0)
    for v in q:
        total = CTX.add(total, CTX.exp(CTX.multiply(CTX.subtract(Decimal(float(v)), top), scale)))
        cum.append(total)
    return [CTX.divide(c, total) for c in cum]


def _bucket(bounds: list[Decimal], u: Decimal) -> int:
    return next(a for a, b in enumerate(bounds) if u < b)


def test_inverse_cdf_on_float64_was_not_pure_at_large_epsilon() -> None:
    q, d, q2 = _inputs()
    p, p2 = float_grid_law(log_probabilities("em", q, d, 30.0)), float_grid_law(log_probabilities("em", q2, d, 30.0))
    assert p.sum() == 1.0 and p2.sum() == 1.0
    assert delta(p, p2, 30.0) >= 2.0**-53  # an outcome with probability 0 on one side and ≥ 2⁻⁵³ on the other
    ideal, ideal2 = probabilities("em", q, d, 30.0), probabilities("em", q2, d, 30.0)
    assert delta(ideal, ideal2, 30.0) < 1e-12  # the exact law is pure ε-DP (up to its own rounding)


@pytest.mark.parametrize("eps", [1.0, 30.0, 200.0])
def test_em_decides_every_word_as_the_exact_law_does(eps: float) -> None:
    q, d, _ = _inputs()
    bounds = _em_boundaries(q, d, eps)
    marks = sorted({int(CTX.multiply(b, WORD)) for b in bounds[:-1] if 0 < b < 1})
    # Fast path: words a safe distance (2⁴⁰ words ≫ the float error band) either side of every
    # boundary are decided by float64 alone (the stand-in refuses to give more words) and exactly.
    far = [w + s for w in marks for s in (-(2**40), 2**40) if 0 <= w + s < WORD]
    far = [w for w in far if min(abs(w - m) for m in marks[max(0, bisect.bisect(marks, w) - 1) :][:2]) >= 2**39]
    assert len(far) >= 8
    got = em_exact_sample(q, d, eps, Words(far), len(far))  # type: ignore[arg-type]  # a stand-in generator
    expected = [_bucket(bounds, Decimal(w) / WORD) for w in far]
    assert got.tolist() == expected
    # Slow path: a word holding boundaries, then all-0 or all-1 bits (U = w·2⁻⁶⁴, or just below
    # (w + 1)·2⁻⁶⁴): the decimal comparison, refined as far as needed, decides as the exact law.
    held = [w for w in marks if 0 < w < WORD - 1]  # not the ends, where outcomes far below 2⁻⁶⁴ crowd
    for w in held[:: max(1, len(held) // 5)]:
        for tail, u in ((0, Decimal(w) / WORD), (WORD - 1, (Decimal(w) + 1) / WORD - Decimal(2) ** -4000)):
            pick = em_exact_sample(q, d, eps, Words([w], then=tail), 1)  # type: ignore[arg-type]  # a stand-in
            assert pick.tolist() == [_bucket(bounds, u)], (w, tail)


def _krr_r(eps: float, n: int, k: int) -> Decimal:
    e = CTX.exp(-Decimal(eps))
    return CTX.divide(CTX.multiply(n - k, e), CTX.add(1, CTX.multiply(n - 1, e)))


@pytest.mark.parametrize("eps", [1.0, 16.0, 37.5, 745.0, 9.2e6])
def test_krr_decides_every_word_as_the_exact_law_does(eps: float) -> None:
    q = np.zeros(N)
    q[3] = 1.0  # one maximum: P(other) = (n − 1)e^{−ε} / (1 + (n − 1)e^{−ε}) = r
    r = _krr_r(eps, N, 1)
    mark = int(CTX.multiply(r, WORD))
    for word, tail, other in (
        (mark + 3, None, False),  # clear of the boundary: decided by the first word
        # on it: the next words decide, exactly (U = 0.word tail 1 in base 2⁶⁴, against r)
        (mark, 0, (Decimal(mark) * WORD**2 + 1) < r * WORD**3),
        (mark, WORD - 1, (Decimal(mark) * WORD**2 + (WORD - 1) * WORD + 1) < r * WORD**3),
    ) + (((mark - 3, None, True),) if mark >= 3 else ()):
        words = [word] if tail is None else [word, tail, 1, 0, 0]
        got = int(krr_exact_sample(q, eps, Words(words), 1)[0])  # type: ignore[arg-type]  # a stand-in generator
        assert (got != 3) is other, (eps, word, tail)


def test_krr_reaches_every_item_at_large_epsilon() -> None:
    """At ε = 37.5 the float sampler could never return 267 of the 499 other items: given the
    group, the item is an exact uniform integer."""
    q = np.zeros(N)
    q[0] = 1.0
    words = [0] * 6000  # every draw lands in the other group (U < r), so the item choice is seen
    got = krr_exact_sample(q, 37.5, Words(words, seed=3), 6000)  # type: ignore[arg-type]  # a stand-in generator
    assert set(got.tolist()) == set(range(1, N))
