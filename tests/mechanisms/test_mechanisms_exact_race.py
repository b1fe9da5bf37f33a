"""The exact race (recsvc.mechanisms.exact_race) and the mechanisms built on it decide every draw
as the real numbers do: driven with chosen words, each output is the argmax (or top k) of the
real a_i + F⁻¹(U_i), computed here in 80-digit decimal, including where float noise never reaches."""

from __future__ import annotations

import decimal
import itertools
import warnings
from decimal import Decimal

import numpy as np
import pytest

from recsvc.mechanisms import MECHANISMS, probabilities, select
from recsvc.mechanisms.exact_race import EXPONENTIAL, ExponentialNoise, GapUtilities, race_argmax, race_top_k
from recsvc.mechanisms.gem import GemUtilities, gem_t, report_correlation_bit
from recsvc.mechanisms.testing import Words
from recsvc.mechanisms.validation import MechanismInputError

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

    def sup_at(self, x: float) -> float:
        return super().sup_at(max(x, 2.0**-53))

    def inf_at(self, x: float) -> float:
        return super().inf_at(max(x, 2.0**-53))


def _disagreements(noise: ExponentialNoise, q: np.ndarray, eps: float, rows: list[list[int]]) -> int:
    """Rows of first words (then the word 1 forever): how many argmaxes differ from the real one."""
    a, real = GapUtilities(q, eps, 1.0), _rnm_real(q, np.ones_like(q), eps)
    return sum(
        int(race_argmax(a, noise, Words(row, then=1), 1)[0]) != _argmax_real(real, row)  # type: ignore[arg-type]  # a stand-in
        for row in rows
    )


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
    a = GapUtilities(np.array([0.0, -100.0]), 1.0, 1.0)
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
    a = GapUtilities(q, 2.0, 1.0)
    for _ in range(30):
        row = rng.integers(0, WORD, 30, dtype=np.uint64).tolist()
        vals = _real_values(q, 2.0, 1.0, [_uniform(w) for w in row])
        best = sorted(range(30), key=vals.__getitem__, reverse=True)[:4]
        assert race_top_k(a, EXPONENTIAL, Words(row, then=1), 4).tolist() == best  # type: ignore[arg-type]  # a stand-in
        got = race_top_k(a, EXPONENTIAL, Words(row, then=1), 4, ordered=False)  # type: ignore[arg-type]  # a stand-in
        assert got.tolist() == sorted(best)


@pytest.mark.parametrize("ordered", [True, False])
def test_the_compiled_check_returns_the_general_paths_output_and_words(ordered: bool) -> None:
    """The compiled exponential check (GapUtilities, no scale) against the general path on the
    same words (a scale of ones takes it): the same leaders, and the same words read after, on
    ties, cells at 0, gaps beyond any float noise and ε over twelve orders of magnitude."""
    pick = np.random.default_rng(3)
    for trial in range(40):
        n = int(pick.integers(2, 500 if trial % 10 == 0 else 40))
        q = pick.normal(size=n) * 10 ** pick.uniform(-3, 3)
        q = np.round(q) if trial % 3 == 0 else q
        eps, d_max, k = 10 ** pick.uniform(-6, 6), 10 ** pick.uniform(-2, 1), int(pick.integers(1, min(n, 12)))
        words = pick.integers(0, WORD, n, dtype=np.uint64)
        words[pick.random(n) < 0.05] = int(pick.integers(0, 2**11))  # a cell at 0
        stream = [*words.tolist(), *pick.integers(0, WORD, 4000, dtype=np.uint64).tolist()]  # the refinements'
        out = []
        for scale in (None, np.ones(n)):
            g, h = Words(stream), Words(stream)
            top = race_top_k(GapUtilities(q, eps, d_max, 2 * k), EXPONENTIAL, g, k, ordered, scale)  # type: ignore[arg-type]  # a stand-in
            one = race_argmax(GapUtilities(q, eps, d_max), EXPONENTIAL, h, 1, scale)  # type: ignore[arg-type]  # a stand-in
            out.append((top.tolist(), one.tolist(), len(g.words), len(h.words)))
        assert out[0] == out[1], trial


def test_near_ties_are_refined_until_certain() -> None:
    """Two candidates with the same score and the same first 53 bits: the next words decide."""
    a = GapUtilities(np.array([1.0, 1.0]), 1.0, 1.0)
    for tail0, tail1, winner in ((5, 9, 0), (9, 5, 1)):  # the smaller U has the larger noise
        got = race_argmax(a, EXPONENTIAL, Words([2**62, 2**62, tail0, tail1], then=0), 1)  # type: ignore[arg-type]  # a stand-in
        assert got.tolist() == [winner]


# --- the mechanisms on the race -----------------------------------------------------------------


def _gem_real_utilities(q: np.ndarray, d: np.ndarray, eps: float, t: float) -> list[Decimal]:
    """a_i = q'_i·ε/2, q'_i = min_j (s_i − s_j)/(Δ_i + Δ_j), s = q − tΔ, in 80-digit decimal."""
    s = [
        CTX.subtract(Decimal(float(a)), CTX.multiply(Decimal(t), Decimal(float(b)))) for a, b in zip(q, d, strict=True)
    ]
    dd = [Decimal(float(b)) for b in d]
    out = []
    for i in range(len(s)):
        m = min(CTX.divide(CTX.subtract(s[i], s[j]), CTX.add(dd[i], dd[j])) for j in range(len(s)))
        out.append(CTX.multiply(m, CTX.divide(Decimal(eps), 2)))
    return out


def _argmax_real(a: list[Decimal], row: list[int]) -> int:
    """The real argmax of a_i − ln U_i; decimal only for the candidates within 10⁻⁶ of the float
    maximum (the float values are within 10⁻¹² of the real ones)."""
    approx = np.array([float(x) for x in a]) - np.log(np.array([float(_uniform(w)) for w in row]))
    near = np.flatnonzero(approx >= approx.max() - 1e-6).tolist()
    return max(near, key=lambda i: CTX.subtract(a[i], CTX.ln(_uniform(row[i]))))


def _rnm_real(q: np.ndarray, d: np.ndarray, eps: float) -> list[Decimal]:
    top, scale = Decimal(float(q.max())), CTX.divide(Decimal(eps), CTX.multiply(2, Decimal(float(d.max()))))
    return [CTX.multiply(CTX.subtract(Decimal(float(v)), top), scale) for v in q]


@pytest.mark.parametrize("name", ["rnm", "pf"])
@pytest.mark.parametrize("eps", [1e-3, 1.0, 37.5, 1e300])
def test_rnm_and_pf_decide_every_row_as_the_reals_do_at_n_500(name: str, eps: float) -> None:
    """n = 500, Δ over six orders of magnitude, neighbours q ± Δ: random rows, and rows whose far
    candidates' cells are at 0 (the noise they need exists only beyond 53 bits)."""
    rng = np.random.default_rng(21)
    d = 10.0 ** rng.uniform(-6, 0, 500)
    q = rng.random(500) * (140.0 * float(d.max()) / eps)  # a_i over [−70, 0]: most beyond 36.7
    sample = MECHANISMS[name].sample
    wins = 0
    for q_in in (q, q + np.where(rng.random(500) < 0.5, 1.0, -1.0) * d):
        a = _rnm_real(q_in, d, eps)
        rows = [rng.integers(2**11, WORD, 500, dtype=np.uint64).tolist() for _ in range(3)]
        far = np.argsort(np.abs(np.array([float(x) for x in a]) + 60.0))[:2]  # a ≈ −60
        for r, j in zip(rows[:2], far, strict=True):
            r[j] = int(rng.integers(0, 2**11))  # first 53 bits 0: U ≈ 2⁻¹¹⁷, noise ≈ 81
        for row in rows:
            got = int(sample(q_in, d, eps, {}, Words(row, then=1), 1)[0])  # type: ignore[arg-type]  # a stand-in
            assert got == _argmax_real(a, row)
            wins += int(got in far)
    assert wins >= 4  # the far candidates won where float noise could not have made them


def test_pf_is_the_brute_force_permute_and_flip_law() -> None:
    """Permute-and-flip by its definition (every order, each candidate's coin p_r in turn) has
    rnm's law, the one pf_sample's race draws from."""
    q, d, eps = np.array([0.0, 0.4, 1.3, 1.3]), np.array([1.0, 0.5, 2.0, 1.0]), 3.0
    p = np.exp((q - q.max()) * eps / (2 * d.max()))
    law = np.zeros(4)
    for order in itertools.permutations(range(4)):
        tails = 1.0
        for r in order:
            law[r] += tails * p[r] / 24
            tails *= 1 - p[r]
    assert law == pytest.approx(probabilities("pf", q, d, eps), abs=1e-12)
    assert law == pytest.approx(probabilities("rnm", q, d, eps), abs=1e-12)


@pytest.mark.parametrize("name", ["gem", "mgem"])
@pytest.mark.parametrize("eps", [1e-3, 1.0, 40.0, 1e6])
def test_gem_and_mgem_decide_every_row_on_the_real_q_prime(name: str, eps: float) -> None:
    rng = np.random.default_rng(4)
    n = 60
    d = 10.0 ** rng.uniform(-6, 0, n)
    q = rng.random(n) * float(d.max())
    t = (1.0 if name == "gem" else -1.0) * gem_t(n, eps, 0.05)
    a = _gem_real_utilities(q, d, eps, t)
    rows = [rng.integers(2**11, WORD, n, dtype=np.uint64).tolist() for _ in range(6)]
    for r in rows[:3]:
        r[int(np.argmin(q))] = 7  # a cell at 0
    for row in rows:
        got = int(MECHANISMS[name].sample(q, d, eps, {"beta": 0.05}, Words(row, then=1), 1)[0])  # type: ignore[arg-type]  # a stand-in
        assert got == _argmax_real(a, row)


def test_gem_bounds_enclose_the_real_q_prime() -> None:
    """The float upper bounds, the leaders' lower bounds and the decimal enclosures of
    GemUtilities hold the real a_i, with Δ over six orders of magnitude."""
    rng = np.random.default_rng(9)
    d = 10.0 ** rng.uniform(-6, 0, 40)
    q = rng.normal(size=40) * 1e3
    t = gem_t(40, 0.7, 0.05)
    real = _gem_real_utilities(q, d, 0.7, t)
    u = GemUtilities(q, d, 0.7, t)
    for i, x in enumerate(real):
        assert Decimal(float(u.value[i])) + Decimal(u.err) >= x >= Decimal(u.lower(i))
    for (lo, hi), x in zip(u.exact(range(40), 40), real, strict=True):
        assert lo <= x <= hi and hi - lo <= abs(x) * Decimal("1e-30") + Decimal("1e-25")


@pytest.mark.parametrize("name", ["rnm", "pf", "gem", "mgem", "combined_gem"])
def test_the_same_words_give_the_same_output_for_q_and_q_plus_c(name: str) -> None:
    """Translation: q on a dyadic grid and c = 2⁴⁰ keep every float exact, so the real inputs
    differ by c only, and every law here is invariant under it: the same rows, the same outputs."""
    rng = np.random.default_rng(3)
    q = np.round(rng.random(50) * 64) / 64
    d = np.full(50, 0.25)
    sample = MECHANISMS[name].sample
    p = {"beta": 0.05, "corr_budget_fraction": 0.6} if "gem" in name else {}
    for _ in range(20):
        row = rng.integers(0, WORD, 60, dtype=np.uint64).tolist()
        picks = [int(sample(qq, d, 2.0, p, Words(list(row), then=1), 1)[0]) for qq in (q, q + 2.0**40)]  # type: ignore[arg-type]  # a stand-in
        assert picks[0] == picks[1]


def test_the_correlation_bit_is_an_exact_bernoulli() -> None:
    """combined_gem's RR keeps the bit iff U < 1/(1 + e^{−ε_c}): U's 53-bit cell just below and
    just above the threshold's, then the cell holding it with the next words all 0 or all 1."""
    eps_c = 0.6 * 2.0
    keep = CTX.divide(1, CTX.add(1, CTX.exp(-Decimal(eps_c))))
    mark = int(CTX.multiply(keep, 2**53))
    q, d = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])  # spearman = 1: the bit is 1
    for cell, then, kept in ((mark - 1, 0, True), (mark + 1, 0, False), (mark, 0, True), (mark, WORD - 1, False)):
        words = Words([cell << 11], then=then)
        bits = report_correlation_bit(q, d, 2.0, {"corr_budget_fraction": 0.6}, words, 1)  # type: ignore[arg-type]  # a stand-in
        assert bits.tolist() == [1 if kept else 0], (cell, then)


def test_an_unrepresentable_score_range_is_refused_for_what_it_is() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning first
        for name in ("em", "rnm", "gem"):
            with pytest.raises(MechanismInputError, match=r"score range max q − min q .* overflows a float64"):
                select(name, [1.7e308, -1.7e308], [1, 1], 1.0)
