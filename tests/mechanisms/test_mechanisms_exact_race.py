"""The exact race (recsvc.mechanisms.exact_race) and the mechanisms built on it decide every draw
as the real numbers do: driven with chosen words, each output is the argmax (or top k) of the
real a_i + F⁻¹(U_i), computed here in 80-digit decimal, including where float noise never reaches."""

from __future__ import annotations

import decimal
from decimal import Decimal

import numpy as np
import pytest

from recsvc.mechanisms.exact_race import EXPONENTIAL, ExponentialNoise, gap_utilities, race_argmax, race_top_k
from recsvc.mechanisms.testing import Words

WORD = 2**64
CTX = decimal.Context(prec=80, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


def _real_values(q: np.ndarray, eps: float, d_max: float, u: list[Decimal]) -> list[Decimal]:
    """v_i = (q_i − max q)·ε/(2Δmax) − ln U_i on the reals (80 digits)."""
    top = Decimal(float(q.max()))
    scale = CTX.divide(Decimal(eps), CTX.multiply(2, Decimal(d_max)))
    return [
        CTX.subtract(CTX.multiply(CTX.subtract(Decimal(float(v)), top), scale), CTX.ln(w))
        for v, w in zip(q, u, strict=True)
    ]


def _uniform(first: int) -> Decimal:
    """U from its first word's top 53 bits, then the word 1 forever: x + 2⁻¹¹⁷/(1 − 2⁻⁶⁴)."""
    tail = CTX.divide(Decimal(2) ** -117, 1 - Decimal(2) ** -64)
    return CTX.add(CTX.divide(first >> 11, Decimal(2**53)), tail)


class _Capped(ExponentialNoise):
    """A deliberately wrong noise: the float sampler's, which never exceeds −ln 2⁻⁵³ (a cell at 0
    gets the value of the next one)."""

    def sup(self, x: np.ndarray) -> np.ndarray:
        return super().sup(np.maximum(x, 2.0**-53))

    def width(self, x: np.ndarray) -> np.ndarray:
        return super().width(np.maximum(x, 2.0**-53))


def _disagreements(noise: ExponentialNoise, q: np.ndarray, eps: float, rows: list[list[int]]) -> int:
    """Rows of first words (then the word 1 forever): how many argmaxes differ from the real one."""
    a = gap_utilities(q, eps, 1.0)
    bad = 0
    for row in rows:
        got = int(race_argmax(a, noise, Words(row, then=1), 1)[0])  # type: ignore[arg-type]  # a stand-in generator
        vals = _real_values(q, eps, 1.0, [_uniform(w) for w in row])
        bad += got != max(range(len(vals)), key=vals.__getitem__)
    return bad


@pytest.mark.parametrize("eps", [1e-3, 1.0, 30.0, 1e6])
def test_race_argmax_decides_random_words_as_the_reals_do(eps: float) -> None:
    rng = np.random.default_rng(11)
    q = np.round(rng.random(40) * 8) / 8 * (2.0 / eps)  # ties, and gaps a few noise scales wide
    rows = [rng.integers(0, WORD, 40, dtype=np.uint64).tolist() for _ in range(60)]
    assert _disagreements(EXPONENTIAL, q, eps, rows) == 0


def test_a_gap_no_float_noise_can_cross_is_crossed_exactly() -> None:
    """q = (0, −100) at ε = 1: a_1 = −50, beyond 36.7 (53 bits) and 44.4 (64 bits). Candidate 1
    wins iff −50 − ln U_1 > −ln U_0, i.e. U_1 < U_0·e^{−50}: its first 53 bits must be 0 and the
    next word decides (U_0 = ½: threshold e^{−50}/2·2¹¹⁷ ≈ 1.6e13)."""
    a = gap_utilities(np.array([0.0, -100.0]), 1.0, 1.0)
    threshold = CTX.multiply(CTX.exp(Decimal(-50)) / 2, Decimal(2) ** 117)
    mark = int(threshold)
    for w, wins in ((mark - 2**20, True), (mark, True), (mark + 1, False), (mark + 2**20, False)):
        got = race_argmax(a, EXPONENTIAL, Words([2**63, 0, 0, w], then=0), 1)  # type: ignore[arg-type]  # a stand-in
        assert got.tolist() == [1 if wins else 0], w
    # the float sampler's noise never lets candidate 1 win, whatever the words
    capped = _Capped()
    assert race_argmax(a, capped, Words([2**63, 0, 0, mark - 2**20], then=0), 1).tolist() == [0]  # type: ignore[arg-type]  # a stand-in


def test_a_wrong_sampler_fails_the_word_audit() -> None:
    """The capped (float-like) noise disagrees with the reals on rows where a far candidate's
    first 53 bits are 0: the audit above catches it."""
    q = np.array([0.0, -100.0, -0.5])
    rows = [[2**63, 5, 2**62], [2**62, 7, 2**63]]  # candidate 1's cell at 0: U_1 ≈ 2⁻¹¹⁷, it wins
    assert _disagreements(EXPONENTIAL, q, 1.0, rows) == 0
    assert _disagreements(_Capped(), q, 1.0, rows) == 2


def test_race_top_k_orders_the_leaders_as_the_reals_do() -> None:
    rng = np.random.default_rng(5)
    q = np.round(rng.random(30) * 4) / 4
    a = gap_utilities(q, 2.0, 1.0)
    for _ in range(30):
        row = rng.integers(0, WORD, 30, dtype=np.uint64).tolist()
        vals = _real_values(q, 2.0, 1.0, [_uniform(w) for w in row])
        best = sorted(range(30), key=vals.__getitem__, reverse=True)[:4]
        assert race_top_k(a, EXPONENTIAL, Words(row, then=1), 4).tolist() == best  # type: ignore[arg-type]  # a stand-in
        got = race_top_k(a, EXPONENTIAL, Words(row, then=1), 4, ordered=False)  # type: ignore[arg-type]  # a stand-in
        assert got.tolist() == sorted(best)


def test_near_ties_are_refined_until_certain() -> None:
    """Two candidates with the same score and the same first 53 bits: the next words decide."""
    a = gap_utilities(np.array([1.0, 1.0]), 1.0, 1.0)
    for tail0, tail1, winner in ((5, 9, 0), (9, 5, 1)):  # the smaller U has the larger noise
        got = race_argmax(a, EXPONENTIAL, Words([2**62, 2**62, tail0, tail1], then=0), 1)  # type: ignore[arg-type]  # a stand-in
        assert got.tolist() == [winner]
