"""The one-shot slates and the other mechanisms of issue 36's second part: the float defects the
peers' suites found (clm's translation, a spurious overflow warning) and exact sampling."""

from __future__ import annotations

import decimal
import math
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from recsvc.mechanisms import log_probabilities, select_slate, slate_log_probabilities, slate_probabilities
from recsvc.mechanisms.exact_peel import em_exact_peel, step_epsilon
from recsvc.mechanisms.testing import Words


def _set_probabilities(law: dict[tuple[int, ...], float]) -> dict[frozenset[int], float]:
    out: dict[frozenset[int], float] = {}
    for s, lp in law.items():
        out[frozenset(s)] = out.get(frozenset(s), 0.0) + math.exp(lp)
    return out


def test_clm_gives_the_same_law_for_scores_far_from_zero_as_for_the_centred_ones() -> None:
    q = 1e12 + np.array([0, 0.3, 1.1, 1.7, 2]) * 1e-3
    far = slate_log_probabilities("clm", q, [1e-3] * 5, 4.0, 2)
    centred = slate_log_probabilities("clm", q - 1e12, [1e-3] * 5, 4.0, 2)  # the same gaps, exactly
    assert max(abs(far[s] - centred[s]) for s in far) < 1e-9  # dividing by Δmax first: 0.094


def test_clm_far_from_zero_loses_at_most_epsilon_and_reaches_it() -> None:
    """Scores at 2⁴⁸ have a float spacing of 1/16: dividing before centring lost 1.015ε here."""
    q = 2.0**48 + np.array([0.527, 2.59, 1.624])
    q2 = q + np.array([1.0, -1.0, -1.0])
    loss = np.abs(
        log_probabilities("clm", q, [1.0] * 3, 8.0, loss_weight=0.99)
        - log_probabilities("clm", q2, [1.0] * 3, 8.0, loss_weight=0.99)
    ).max()
    assert 0.98 * 8.0 < loss <= 8.0 * (1 + 1e-9)


def test_clm_at_the_top_of_the_float_range_samples_its_finite_law() -> None:
    q = 1e303 * (1 + np.arange(4) * 1e-15)
    law = _set_probabilities(slate_log_probabilities("clm", q, [1e-6] * 4, 2e-294, 2))
    assert all(math.isfinite(p) for p in law.values())
    p23 = law[frozenset({2, 3})]
    assert 0.40 < p23 < 0.44  # 0.4206...; the division overflowed and always gave {2, 3}
    rng = np.random.default_rng(5)
    hits = sum(set(select_slate("clm", q, [1e-6] * 4, 2e-294, 2, rng).tolist()) == {2, 3} for _ in range(2000))
    se = math.sqrt(p23 * (1 - p23) / 2000)
    assert abs(hits / 2000 - p23) < 5 * se


def test_the_oneshot_slate_law_at_large_epsilon_warns_of_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        law = slate_probabilities("oneshot", [0, 1, 2, 3], [1] * 4, 1000.0, 2)
    assert law[(3, 2)] == pytest.approx(1.0)


# --- gumbel: k exact exponential-mechanism draws ------------------------------------------------

WORD = 2**64
CTX = decimal.Context(prec=120, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)
# Adversarial: gaps far beyond any float bound at large ε, a tie, Δ over six orders of magnitude.
GUMBEL_Q = np.array([0.0, 3.0, 3.0, 1e-9, 40.0, 2.5, 1000.0, 39.999999])
GUMBEL_D = np.array([1e-6, 1.0, 0.3, 1e-3, 1.0, 0.5, 2e-6, 0.01])


def _pl_bounds(q: np.ndarray, dmax: float, eps: float, left: list[int]) -> list[Decimal]:
    """The exact cumulative probabilities S_a/S over ``left`` (in order) of one em step at eps."""
    scale = CTX.divide(Decimal(eps), CTX.multiply(2, Decimal(dmax)))
    top = max(Decimal(float(q[i])) for i in left)
    cum, total = [], Decimal(0)
    for i in left:
        total = CTX.add(total, CTX.exp(CTX.multiply(CTX.subtract(Decimal(float(q[i])), top), scale)))
        cum.append(total)
    return [CTX.divide(c, total) for c in cum]


def _reference_slate(q: np.ndarray, dmax: float, eps: float, us: list[Decimal]) -> list[int]:
    left, out = list(range(q.shape[0])), []
    for u in us:
        bounds = _pl_bounds(q, dmax, eps, left)
        out.append(left.pop(next(j for j, b in enumerate(bounds) if u < b)))
    return out


def _words_on_boundaries(q: np.ndarray, dmax: float, eps: float, k: int, rng: np.random.Generator) -> list[int]:
    """k words, each the 64-bit prefix of one of its step's exact boundaries (given the steps
    before it decided as the boundary's lower side), or a random word where a step has none."""
    left, words = list(range(q.shape[0])), []
    for _ in range(k):
        bounds = _pl_bounds(q, dmax, eps, left)
        marks = [int(CTX.multiply(b, WORD)) for b in bounds[:-1] if 0 < b < 1]
        marks = [m for m in marks if 0 < m < WORD - 1]
        w = int(marks[int(rng.integers(len(marks)))]) if marks else int(rng.integers(0, WORD, dtype=np.uint64))
        words.append(w)
        u = Decimal(w) / WORD
        left.pop(next(j for j, b in enumerate(bounds) if u < b))
    return words


@pytest.mark.parametrize("eps", [1e-3, 1.0, 30.0, 1e4, 1e7])
def test_gumbel_decides_every_word_as_the_exact_plackett_luce_law(eps: float) -> None:
    q, d, k = GUMBEL_Q, GUMBEL_D, 3
    eps_step = step_epsilon(eps, k)
    dmax = float(d.max())
    rng = np.random.default_rng(int(eps * 1000) % 2**32)
    for _ in range(4):
        words = _words_on_boundaries(q, dmax, eps_step, k, rng)
        for tail, us in (
            (0, [Decimal(w) / WORD for w in words]),
            (WORD - 1, [(Decimal(w) + 1) / WORD - Decimal(2) ** -4000 for w in words]),
        ):
            got = em_exact_peel(q, d, eps, k, Words(words, then=tail))  # type: ignore[arg-type]  # a stand-in
            assert got.tolist() == _reference_slate(q, dmax, eps_step, us), (eps, words, tail)


def test_gumbel_decides_far_words_on_the_float_path_alone() -> None:
    """Words far from every boundary need no more bits: the stand-in refuses to give any."""
    q, d, k, eps = GUMBEL_Q, GUMBEL_D, 4, 30.0
    eps_step = step_epsilon(eps, k)
    rng = np.random.default_rng(3)
    for _ in range(20):
        words = [int(w) for w in rng.integers(0, WORD, size=k, dtype=np.uint64)]
        got = em_exact_peel(q, d, eps, k, Words(words))  # type: ignore[arg-type]  # a stand-in generator
        assert got.tolist() == _reference_slate(q, float(d.max()), eps_step, [Decimal(w) / WORD for w in words])


def test_the_word_audit_catches_peeling_with_the_remaining_items_delta_max() -> None:
    """A wrong law (peeling ``em``, whose Δmax is recomputed over the items left) is told apart
    by the words: once the item with the largest Δ is out, its steps are sharper."""
    q, d, eps, k = np.array([10.0, 0.0, 0.5, 0.3]), np.array([1.0, 0.01, 0.01, 0.01]), 6.0, 2
    eps_step = step_epsilon(eps, k)
    us = [Decimal(0), Decimal(1) / 10]
    words = [int(u * WORD) for u in us]
    right = _reference_slate(q, 1.0, eps_step, us)
    wrong = [0] + [j + 1 for j in _reference_slate(q[1:], 0.01, eps_step, us[1:])]
    assert right == [0, 1] and wrong == [0, 2]
    assert em_exact_peel(q, d, eps, k, Words(words, then=0)).tolist() == right  # type: ignore[arg-type]


def test_step_epsilon_never_spends_more_than_epsilon() -> None:
    for eps, k in ((1.0, 3), (0.1, 7), (30.0, 11), (5e-324 * 9, 3), (1.7e308, 10)):
        step = step_epsilon(eps, k)
        assert Fraction(step) * k <= Fraction(eps) < Fraction(float(np.nextafter(step, math.inf))) * k
