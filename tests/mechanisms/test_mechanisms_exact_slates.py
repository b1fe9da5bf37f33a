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

from recsvc.mechanisms import (
    MECHANISMS,
    charged_epsilon,
    log_probabilities,
    select_slate,
    slate_log_probabilities,
    slate_probabilities,
)
from recsvc.mechanisms.exact_noise import LAPLACE
from recsvc.mechanisms.exact_peel import em_exact_peel, step_epsilon
from recsvc.mechanisms.exact_race import GapUtilities, _upper_error
from recsvc.mechanisms.exact_stopping import _signed_log, best_record, geometric_counts, logarithmic_counts
from recsvc.mechanisms.noisy_max import rnm_laplace_sample
from recsvc.mechanisms.testing import Words
from recsvc.mechanisms.topk import gumbel_top_k, oneshot_top_k


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
    hits = sum(set(select_slate("clm", q, [1e-6] * 4, 2e-294, 2, rng).tolist()) == {2, 3} for _ in range(400))
    se = math.sqrt(p23 * (1 - p23) / 400)
    assert abs(hits / 400 - p23) < 5 * se


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
        u = CTX.divide(w, WORD)
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
            (0, [CTX.divide(w, WORD) for w in words]),
            (WORD - 1, [CTX.subtract(CTX.divide(w + 1, WORD), Decimal(2) ** -4000) for w in words]),
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
        assert got.tolist() == _reference_slate(q, float(d.max()), eps_step, [CTX.divide(w, WORD) for w in words])


def test_the_word_audit_catches_peeling_with_the_remaining_items_delta_max() -> None:
    """A wrong law (peeling ``em``, whose Δmax is recomputed over the items left) is told apart
    by the words: once the item with the largest Δ is out, its steps are sharper."""
    q, d, eps, k = np.array([10.0, 0.0, 0.5, 0.3]), np.array([1.0, 0.01, 0.01, 0.01]), 6.0, 2
    eps_step = step_epsilon(eps, k)
    us = [Decimal(0), Decimal("0.1")]
    words = [int(u * WORD) for u in us]
    right = _reference_slate(q, 1.0, eps_step, us)
    wrong = [0] + [j + 1 for j in _reference_slate(q[1:], 0.01, eps_step, us[1:])]
    assert right == [0, 1] and wrong == [0, 2]
    assert em_exact_peel(q, d, eps, k, Words(words, then=0)).tolist() == right  # type: ignore[arg-type]  # Words stands in for the Generator


def test_step_epsilon_never_spends_more_than_epsilon() -> None:
    for eps, k in ((1.0, 3), (0.1, 7), (30.0, 11), (5e-324 * 9, 3), (1.7e308, 10)):
        step = step_epsilon(eps, k)
        assert Fraction(step) * k <= Fraction(eps) < Fraction(float(np.nextafter(step, math.inf))) * k


# --- Laplace races: rnm_laplace, and the records of rs / rs_improved -------------------------------

CELL = Decimal(2.0**-53)  # exact (a float); Decimal(2) ** -53 would round to 28 digits


ROWS = decimal.Context(prec=50, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)  # enough to order 500 values


def _laplace_quantile(u: Decimal, ctx: decimal.Context = CTX) -> Decimal:
    if u <= Decimal("0.5"):
        return ctx.ln(ctx.multiply(2, u))
    return ctx.minus(ctx.ln(ctx.multiply(2, ctx.subtract(1, u))))


def _uniform(first: int, tail: int) -> Decimal:
    """U from its first word's top 53 bits, then ``tail`` forever (the race's refinement words)."""
    return CTX.add(CTX.multiply(first >> 11, CELL), CTX.multiply(CELL, CTX.divide(tail, WORD - 1)))


@pytest.mark.parametrize(
    "x", [2.0**-53, 3 * 2.0**-53, 1e-9, 0.25, 0.5 - 2.0**-53, 0.5, 0.5 + 2.0**-53, 0.75, 1 - 2 * 2.0**-53]
)
def test_laplace_cell_bounds_enclose_the_real_quantile(x: float) -> None:
    lo, hi = Decimal(x), CTX.add(Decimal(x), CELL)
    f_lo, f_hi = _laplace_quantile(lo), _laplace_quantile(hi)
    assert abs(Decimal(LAPLACE.sup_at(x)) - f_hi) <= Decimal(LAPLACE.error)
    # the vectorised log may differ from math.log in the last bit (SIMD paths differ by CPU): both within the bound
    assert abs(Decimal(float(LAPLACE.sup(np.array([x]))[0])) - f_hi) <= Decimal(LAPLACE.error)
    assert abs(Decimal(LAPLACE.inf_at(x)) - f_lo) <= Decimal(LAPLACE.error)
    # the record race's compiled quantile (random stopping) keeps the same error bound
    assert abs(Decimal(_signed_log(x + 2.0**-53)) - f_hi) <= Decimal(LAPLACE.error)
    assert abs(Decimal(_signed_log(x)) - f_lo) <= Decimal(LAPLACE.error)
    for prec in (30, 60):
        bottom, top = LAPLACE.enclose(lo, hi, prec)
        assert bottom <= f_lo and f_hi <= top and (top - bottom) - (f_hi - f_lo) < Decimal(10) ** (5 - prec)


def test_laplace_cells_at_the_ends_are_unbounded() -> None:
    assert LAPLACE.inf_at(0.0) == -math.inf and LAPLACE.sup_at(1 - 2.0**-53) == math.inf
    assert LAPLACE.enclose(Decimal(0), CELL, 40)[0] == Decimal("-Infinity")
    assert LAPLACE.enclose(CTX.subtract(1, CELL), Decimal(1), 40)[1] == Decimal("Infinity")


def _real_argmax(a: list[Decimal], row: list[int], tail: int) -> int:
    """argmax_i a_i + F⁻¹(U_i) on the reals: in decimal for the values within 1e-6 of the float
    leader (and for every U whose first 53 bits are all 0 or all 1, beyond float's reach)."""
    bits = np.array(row, dtype=np.uint64) >> np.uint64(11)
    u = (bits.astype(np.float64) + 0.5) * 2.0**-53
    with np.errstate(divide="ignore"):  # the top cell's midpoint rounds to 1: an extreme, redone below
        approx = np.array([float(x) for x in a]) + np.where(u <= 0.5, np.log(2 * u), -np.log(2 * (1 - u)))
    extreme = np.flatnonzero((bits == 0) | (bits == 2**53 - 1))
    for i in extreme:
        approx[i] = float(ROWS.add(a[i], _laplace_quantile(_uniform(row[i], tail), ROWS)))
    near = np.flatnonzero(approx >= approx.max() - 1e-6)
    v = {int(i): ROWS.add(a[i], _laplace_quantile(_uniform(row[i], tail), ROWS)) for i in near}
    return max(v, key=v.__getitem__)


def _laplace_rows(rng: np.random.Generator, n: int, far: np.ndarray) -> list[int]:
    """Random first words, but the ``far`` candidates' top 53 bits all ones: with the refinement
    word 2⁶⁴ − 2 their U is 1 − 2⁻¹¹⁷·…, Laplace noise ≈ 80, which float noise never reaches."""
    row = rng.integers(2**11, WORD - 2**11, n, dtype=np.uint64).tolist()
    for j in far:
        row[int(j)] = WORD - 1
    return row


@pytest.mark.parametrize("eps", [1e-3, 1.0, 37.5, 1e300])
def test_rnm_laplace_decides_every_row_as_the_reals_do_at_n_500(eps: float) -> None:
    rng = np.random.default_rng(11)
    d = 10.0 ** rng.uniform(-6, 0, 500)
    q = rng.random(500) * (140.0 * float(d.max()) / eps)  # gaps over [−70, 0] noise scales
    tail = WORD - 2
    wins = 0
    for q_in in (q, q + np.where(rng.random(500) < 0.5, 1.0, -1.0) * d):
        top = Decimal(float(q_in.max()))
        scale = CTX.divide(Decimal(eps), CTX.multiply(2, Decimal(float(d.max()))))
        a = [CTX.multiply(CTX.subtract(Decimal(float(v)), top), scale) for v in q_in]
        far = np.argsort(np.abs(np.array([float(x) for x in a]) + 60.0))[:1]
        for far_row in (True, False):
            row = _laplace_rows(rng, 500, far if far_row else np.empty(0, np.intp))
            got = int(rnm_laplace_sample(q_in, d, eps, {}, Words(row, then=tail), 1)[0])  # type: ignore[arg-type]  # a stand-in
            assert got == _real_argmax(a, row, tail)
            wins += int(far_row and got in far)
    assert wins == 2  # the far candidate won where float noise could not have made it


def test_a_float_laplace_sampler_fails_the_row_audit() -> None:
    """The float sampler's noise is bounded (|L| ≤ 36.7): the far candidate never wins."""
    q, d, eps, tail = np.array([0.0, 60.0]), np.ones(2), 2.0, WORD - 2
    row = [WORD - 1, 2**63]  # candidate 0: U ≈ 1 − 2⁻¹¹⁷ (L ≈ 80); candidate 1: U ≈ ½ (L ≈ 0)
    assert int(rnm_laplace_sample(q, d, eps, {}, Words(row, then=tail), 1)[0]) == 0  # type: ignore[arg-type]  # Words stands in for the Generator
    x = (np.array(row, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    float_noise = -np.log(2.0 * np.maximum(1.0 - x, 2.0**-53))
    assert int(np.argmax((q - q.max()) * (eps / 2.0) + float_noise)) == 1


@pytest.mark.parametrize("eps", [1e-3, 1.0, 1e300])
def test_rnm_laplace_batches_decide_every_row_as_the_reals_do(eps: float) -> None:
    """A batch is one compiled pass over its rows (the Monte Carlo's path); the rows whose float
    bounds do not decide go to the exact race: every row is the real argmax. The float sampler on
    the same words (a deliberately wrong one: its noise stops at 36.7) misses the far winners."""
    rng = np.random.default_rng(12)
    n, tail = 60, WORD - 2
    d = 10.0 ** rng.uniform(-3, 0, n)
    q = rng.random(n) * (140.0 * float(d.max()) / eps)
    top = Decimal(float(q.max()))
    scale = CTX.divide(Decimal(eps), CTX.multiply(2, Decimal(float(d.max()))))
    a = [CTX.multiply(CTX.subtract(Decimal(float(v)), top), scale) for v in q]
    far = np.argsort(np.abs(np.array([float(x) for x in a]) + 60.0))[:1]
    rows = [_laplace_rows(rng, n, far if r % 3 == 0 else np.empty(0, np.intp)) for r in range(9)]
    real = [_real_argmax(a, row, tail) for row in rows]
    words = [w for row in rows for w in row]
    got = rnm_laplace_sample(q, d, eps, {}, Words(words, then=tail), len(rows))  # type: ignore[arg-type]  # a stand-in
    assert got.tolist() == real
    assert [real[r] for r in range(0, 9, 3)] == [int(far[0])] * 3  # the far candidate won where it could
    gap = GapUtilities(q, eps, float(d.max()))
    x = Words(words).random((len(rows), n))
    lead = LAPLACE.gap_race(gap, None, x, _upper_error(gap, LAPLACE, 1.0))
    assert [bool(lead[r] < 0) for r in range(9)] == [r % 3 == 0 for r in range(9)]  # the far rows went on
    with np.errstate(divide="ignore"):
        float_noise = np.where(x <= 0.5, np.log(2.0 * x), -np.log(2.0 * np.maximum(1.0 - x, 2.0**-53)))
    wrong = np.argmax(gap.value + float_noise, axis=1)
    assert [int(wrong[r]) == real[r] for r in range(9)] == [r % 3 != 0 for r in range(9)]


def test_rnm_laplace_refines_a_float_tie_by_the_next_words() -> None:
    """Equal scores and equal first 53 bits tie in floats: the next word of each U decides, alone
    and within a batch (the rows in order)."""
    q, d, same, hi, lo = np.zeros(2), np.ones(2), 3 << 61, 2**63 + 5, 2**63 - 5
    assert rnm_laplace_sample(q, d, 1.0, {}, Words([same, same, hi, lo]), 1).tolist() == [0]  # type: ignore[arg-type]  # a stand-in
    assert rnm_laplace_sample(q, d, 1.0, {}, Words([same, same, lo, hi]), 1).tolist() == [1]  # type: ignore[arg-type]  # a stand-in
    words = [same, same, 5, 5, hi, lo, lo, hi]  # two tied rows (U ≈ ¾, U ≈ 0), then each row's words
    assert rnm_laplace_sample(q, d, 1.0, {}, Words(words), 2).tolist() == [0, 1]  # type: ignore[arg-type]  # a stand-in


# --- random stopping: K and the best record, exactly --------------------------------------------

GAMMA = 2.0**-20 + 2.0**-70  # 1 − γ is not a float: fl(1 − γ) moves every boundary by ~k·2⁻⁷⁰


def _real_uniform(words: list[int], then: int) -> Decimal:
    """U whose 64-bit words are ``words`` and then ``then`` forever, to 120 digits."""
    u = CTX.divide(sum(w * WORD ** (len(words) - 1 - i) for i, w in enumerate(words)), WORD ** len(words))
    return CTX.add(u, CTX.divide(then, WORD ** len(words) * (WORD - 1)))


def _geometric_cases(gamma: float) -> list[tuple[list[int], int, int]]:
    """(words, then, K) where K = 1 + ⌊ln U / ln(1 − γ)⌋ on the reals: U's first two words either
    side of each boundary (1 − γ)^k to within 2⁻¹²⁸ (decided by more bits than a float has), words
    2³⁰ away (decided by the float bounds), and a U below 2⁻⁶⁴ (whose log no cell bounds)."""
    p = CTX.subtract(1, Decimal(gamma))
    log_p = CTX.ln(p)
    cases = []
    for k in (1, 2, 3, 7, 40):
        edge = CTX.multiply(CTX.power(p, k), WORD**2)  # (1 − γ)^k·2¹²⁸: an integer at k = 1
        e, whole = int(edge), edge == int(edge)  # then a word of ½ keeps U off it (U = edge never ends)
        if e < 2**100:
            continue  # 0.9⁴⁰: too close to 0 for these words
        for x, want in ((e - 1 if whole else e, k + 1), (e if whole else e + 1, k)):
            cases.append(([x >> 64, x % WORD], 2**63 if whole else 0, want))
        cases += [([(e >> 64) - 2**30], 0, k + 1), ([(e >> 64) + 2**30], 0, k)]
    for words, then in (([0, 5], 2**63), ([0, 0, 1], 0)):
        t = CTX.divide(CTX.ln(_real_uniform(words, then)), log_p)
        cases.append((words, then, int(t.to_integral_value(decimal.ROUND_FLOOR)) + 1))
    return cases


@pytest.mark.parametrize("gamma", [GAMMA, 0.3, 0.9])
def test_the_geometric_count_inverts_its_exact_tail_word_by_word(gamma: float) -> None:
    """P(K > k) = (1 − γ)^k: K > k exactly when U ≤ (1 − γ)^k, on both sides of every boundary."""
    for words, then, want in _geometric_cases(gamma):
        assert int(geometric_counts(gamma, 1, Words(words, then=then))[0]) == want, (words, then)  # type: ignore[arg-type]  # Words stands in for the Generator
    far = [_geometric_cases(gamma)[i] for i in (2, 7)]  # two draws in one call, one word each
    got = geometric_counts(gamma, 2, Words([words[0] for words, _, _ in far]))  # type: ignore[arg-type]  # Words stands in for the Generator
    assert got.tolist() == [want for _, _, want in far]


def test_a_float_geometric_sampler_fails_the_word_audit() -> None:
    """Inversion on the first 53 bits of U in float64 (numpy's way) gives both sides of a boundary
    the same K: the audit above tells it from the exact sampler."""

    def float_count(words: list[int]) -> int:
        u = ((words[0] >> 11) + 0.5) * 2.0**-53
        return 1 + math.floor(math.log(u) / math.log1p(-GAMMA))

    cases = _geometric_cases(GAMMA)
    assert any(float_count(words) != want for words, _, want in cases)


def _log_cumulative(gamma: float, k_max: int) -> list[Decimal]:
    """S_k / L for k = 1 … k_max: P(K ≤ k) of Logarithmic(1 − γ), to 120 digits."""
    p, total, power, out = CTX.subtract(1, Decimal(gamma)), Decimal(0), Decimal(1), []
    log_l = CTX.minus(CTX.ln(Decimal(gamma)))
    for k in range(1, k_max + 1):
        power = CTX.multiply(power, p)
        total = CTX.add(total, CTX.divide(power, k))
        out.append(CTX.divide(total, log_l))
    return out


@pytest.mark.parametrize("gamma", [0.05, 0.008, 0.9])
def test_the_logarithmic_count_decides_every_word_as_its_exact_cdf(gamma: float) -> None:
    cdf = _log_cumulative(gamma, 40)
    for k, c in enumerate(cdf[:12], start=1):
        mark = int(CTX.multiply(c, WORD))  # U's 64-bit prefix holds the boundary P(K ≤ k)
        for tail, u in (
            (0, CTX.divide(mark, WORD)),
            (WORD - 1, CTX.subtract(CTX.divide(mark + 1, WORD), Decimal(2) ** -4000)),
        ):
            want = next(j for j, b in enumerate(cdf, start=1) if u < b)
            assert int(logarithmic_counts(gamma, 1, Words([mark], then=tail))[0]) == want, (k, tail)  # type: ignore[arg-type]  # Words stands in for the Generator
        for far in (mark - 2**30, mark + 2**30):  # decided by the float table alone
            if 0 <= far < WORD:
                want = next(j for j, b in enumerate(cdf, start=1) if CTX.divide(far, WORD) < b)
                assert int(logarithmic_counts(gamma, 1, Words([far]))[0]) == want  # type: ignore[arg-type]  # Words stands in for the Generator


@pytest.mark.parametrize(("c", "eps"), [(3, 1e-3), (3, 1.0), (2, 30.0), (2, 1e6)])
def test_the_best_record_is_the_real_argmax_of_the_laplace_records(c: int, eps: float) -> None:
    """One trial (the service's call) and three in one call (a batch's), word by word: the
    candidates' words (w mod n; one word below 2⁶⁴ mod n = 16, rejected and drawn again), then the
    records' cells."""
    rng = np.random.default_rng(8)
    n, count = 40, 25
    d = 10.0 ** rng.uniform(-6, 0, n)
    q = rng.random(n) * (60.0 * c * float(d.max()) / eps)
    unit = CTX.divide(Decimal(eps), c)  # records in units of c/ε: Laplace(cΔ_a/ε) is Δ_a·L
    tail = WORD - 2
    for trials in (1, 3):
        picks = rng.integers(16, WORD, trials * count, dtype=np.uint64).tolist()
        again = int(rng.integers(16, WORD, dtype=np.uint64))
        a_all = np.array([w % n for w in [again, *picks[1:]]], dtype=np.int64)
        rows, want = [3, *picks[1:], again], []  # the first pick, 3, is rejected: ``again`` replaces it
        for a in np.split(a_all, trials):
            b = d[a]
            top = Decimal(float(q[a].max()))
            base = [CTX.multiply(CTX.subtract(Decimal(float(q[i])), top), unit) for i in a]
            row = rng.integers(2**11, WORD - 2**11, count, dtype=np.uint64).tolist()
            row[int(np.argmin(q[a]))] = WORD - 1  # the worst record's noise ≈ 80 scales of its Δ
            v = [
                ROWS.add(bs, ROWS.multiply(Decimal(float(bj)), _laplace_quantile(_uniform(w, tail), ROWS)))
                for bs, bj, w in zip(base, b, row, strict=True)
            ]
            rows += row
            want.append(int(a[max(range(count), key=v.__getitem__)]))
        got = best_record(q, d, c, eps, np.full(trials, count), Words(rows, then=tail))  # type: ignore[arg-type]  # Words stands in for the Generator
        assert got.tolist() == want


# --- the charge is the map, and the map is tight where the proof is ---------------------------------


@pytest.mark.parametrize("eps", [1e-3, 0.5, 2.0, 30.0])
def test_the_oneshot_charge_bounds_the_slate_loss_and_is_reached(eps: float) -> None:
    """The 3-slate's charge (what the service charges: charged_epsilon, one pass at ε) against
    the exact slate law's worst log-ratio on the pair where three items rise by Δ and three fall:
    the randomness-alignment proof is tight there, so the worst loss equals the charge."""
    charge = charged_epsilon("oneshot", eps, 3)
    assert charge == eps
    for q in (np.zeros(6), np.array([0.0, 0.0, 0.0, -40.0, -40.0, -40.0])):
        q2 = q + np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
        a = slate_log_probabilities("oneshot", q, [1.0] * 6, eps, 3)
        b = slate_log_probabilities("oneshot", q2, [1.0] * 6, eps, 3)
        worst = max(abs(a[s] - b[s]) for s in a if math.isfinite(a[s]))
        assert charge * (1 - 1e-9) <= worst <= charge * (1 + 1e-9)


_SAMPLERS = {
    "oneshot": lambda q, d, g: oneshot_top_k(q, d, 2.0, {}, g, 3),
    "gumbel": lambda q, d, g: gumbel_top_k(q, d, 2.0, {}, g, 3),
    "rnm_laplace": lambda q, d, g: MECHANISMS["rnm_laplace"].sample(q, d, 2.0, {}, g, 1),
    "rs": lambda q, d, g: MECHANISMS["rs"].sample(q, d, 2.0, {"gamma": 0.2}, g, 1),
    "rs_improved": lambda q, d, g: MECHANISMS["rs_improved"].sample(q, d, 2.0, {"gamma": 0.2}, g, 1),
    "clm": lambda q, d, g: MECHANISMS["clm"].sample(q, d, 2.0, {"loss_weight": 0.5}, g, 1),
    "clm k = 3": lambda q, d, g: MECHANISMS["clm"].top_k(q, d, 2.0, {"loss_weight": 0.3}, g, 3),  # type: ignore[misc]  # clm has a top_k
}


@pytest.mark.parametrize("name", sorted(_SAMPLERS))
def test_the_same_words_give_the_same_output_for_q_and_q_plus_c(name: str) -> None:
    """Translation: q on a dyadic grid and c = 2⁴⁰ keep every float exact, so the real inputs
    differ by c only, and every law here is invariant under it: the same words, the same outputs."""
    rng = np.random.default_rng(5)
    q = np.round(rng.random(30) * 64) / 64
    d = np.full(30, 0.25)
    for _ in range(10):
        row = rng.integers(0, WORD, 600, dtype=np.uint64).tolist()
        picks = [_SAMPLERS[name](qq, d, Words(list(row), seed=2, then=1)).tolist() for qq in (q, q + 2.0**40)]
        assert picks[0] == picks[1]
