"""Random stopping sampled exactly: the number of draws K, the candidates and the best noisy
record, each from its real-number law (``rs``, ``rs_improved``; random_stopping.py has the
mechanisms and their proofs).

* **K for rs**, Geometric(γ) on {1, 2, …}, by inversion: K = 1 + ⌊t⌋ with t = ln U / ln(1 − γ)
  for one real uniform U, since P(K > k) = P(U ≤ (1 − γ)^k) = (1 − γ)^k. m = −ln(1 − γ) is bracketed
  by two floats from a 40-digit :mod:`decimal` logarithm of the exact 1 − γ (cached per γ); U's
  64-bit prefix w bounds ln U over its cell [w, w + 1)·2⁻⁶⁴ by one float ``log`` of each end
  (within 4 ulps, the conversions and roundings widened by 12u + 4u). A cell whose bounds on t
  have one floor decides K (all but ~10⁻¹¹ of draws); otherwise :mod:`decimal` does the same at a
  precision that grows with U's bits (:func:`_geometric_slow`).
* **K for rs_improved**, Logarithmic(1 − γ): P(K = k) = p^k / (k·L), p = 1 − γ, L = ln(1/γ), by
  inverse CDF: K is the first k with U·L < S_k = Σ_{j ≤ k} p^j / j. The float S_k (terms
  exp(j·ln p̂)/j and their cumulative sum: within (3k + 12 + 10k·|ln p|)·u relatively, p̂ = fl(1 − γ)
  included) and L = −ln γ (one ``log``, within 10u) bound the exact ones; a 64-bit prefix of U whose
  interval lies strictly between two bounded S's decides K. Otherwise, and beyond the last term
  computed, :mod:`decimal` does the same comparison at a precision that grows with U's bits.
* **The candidates** are exactly uniform on {0, …, n − 1}: a raw 64-bit word w at least 2⁶⁴ mod n
  gives w mod n (the accepted words cover every residue equally often), a smaller one (probability
  below n·2⁻⁶⁴) is drawn again (:func:`uniform_below`); a call of 1,024 or more takes numpy's
  ``integers``, which rejects on raw bits too (Lemire's method), exactly uniform.
* **The best record**, argmax_j q_{a_j} + (cΔ_{a_j}/ε)·L_j with L_j ~ Laplace(1), is an exact
  race: each trial's records are raced on float bounds of each record over its 53-bit cell, in
  one compiled pass (:func:`_lead_records`; a trial is decided when its float leader's lower bound
  clears every other record's upper bound), and a trial the bounds do not decide goes to
  :func:`~recsvc.mechanisms.exact_race.race_argmax` with Laplace noise on the same cells. In units
  of c/ε: utilities (q_{a_j} − max_t)·ε/c, max_t the trial's largest candidate score (any common
  shift leaves the argmax alone), and noise scales b_j = Δ_{a_j} themselves, floats, so no scale is
  rounded. Every record is then q_a + Laplace(cΔ_a/ε) on the reals, an (ε/c)-DP release of its
  candidate, which is all the stopping theorems ask of the base mechanism: the law drawn is the
  one the proofs are about, exactly (and it needs no O(n) pass over Δ).

Both counts and the race's bounds are numba kernels with IEEE semantics (no reassociation): their operations and
libm's ``log``, whose error the bounds above assume to be at most 4 ulps (numpy's is also).
"""

from __future__ import annotations

import decimal
import functools
import math
from decimal import Decimal

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_noise import LAPLACE, _quantile
from recsvc.mechanisms.exact_race import GapUtilities, race_argmax
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.mechanisms.exact_sampling import WORD, decimal_context, uniform_words

_CHUNK = 1 << 18  # records raced per compiled pass (best_record)
_RAW_CANDIDATES = 1024  # fewer candidates than this are drawn from raw words (uniform_below)
_MAX_TERMS = 2_000_000  # the float table's length at most (γ ≥ 2⁻¹⁸ needs fewer); beyond, decimal
_CELL = 2.0**-53  # a record's uniform is known to its first 53 bits: a cell of this width
_TO_UNIT = 2.0**-64  # a 64-bit word w is U's prefix: U ∈ [w, w + 1)·2⁻⁶⁴
_signed_log = _quantile  # Laplace's F⁻¹(y) in float64, one y: exact_noise's kernel


@functools.lru_cache(maxsize=64)
def _geometric_rate(gamma: float) -> tuple[Decimal, float, float]:
    """(1 − γ) exactly, and floats m_lo ≤ m = −ln(1 − γ) ≤ m_hi. A float γ has at most 1,074
    decimal digits, so 1 − γ at 1,100 digits is exact; the 40-digit ln is within 10⁻³⁹ relatively
    and its nearest float within half an ulp, so one float step either way brackets m."""
    p = decimal_context(1100).subtract(1, Decimal(gamma))
    m = float(decimal_context(40).minus(decimal_context(40).ln(p)))
    return p, float(np.nextafter(m, 0.0)), float(np.nextafter(m, math.inf))


@numba.njit(cache=True, nogil=True)
def _geometric_fast(words: np.ndarray, m_lo: float, m_hi: float) -> np.ndarray:  # pragma: no cover - numba
    """K = 1 + ⌊ln U / ln(1 − γ)⌋ for each word's cell where float bounds decide it, else −1.

    b = fl(w) is within u of w, fl(b + 1) within 2.01u of w + 1; each ``log`` within 4 ulps (8u
    of its value): |ln U| over the cell is at most |ln(b·2⁻⁶⁴)|·(1 + 12u) + 4u and at least
    |ln(fl(b + 1)·2⁻⁶⁴)|·(1 − 12u) − 4u, and each division by m's bounds rounds by ≤ u (2u kept)."""
    u = 2.0**-53
    out = np.empty(words.shape[0], dtype=np.int64)
    for i in range(words.shape[0]):
        b = float(words[i])
        a_max = -np.log(b * _TO_UNIT) * (1.0 + 12.0 * u) + 4.0 * u  # +inf at w = 0
        a_min = max(-np.log((b + 1.0) * _TO_UNIT) * (1.0 - 12.0 * u) - 4.0 * u, 0.0)
        t_max = a_max / m_lo * (1.0 + 2.0 * u)
        t_min = a_min / m_hi * (1.0 - 2.0 * u)
        if t_max < 2.0**52 and math.floor(t_min) == math.floor(t_max):
            out[i] = np.int64(math.floor(t_min)) + 1
        else:
            out[i] = -1
    return out


def geometric_counts(gamma: float, size: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``size`` draws of K ~ Geometric(γ) on {1, 2, …}, exactly, one word of U each by inversion
    (module docstring)."""
    _, m_lo, m_hi = _geometric_rate(gamma)
    words = uniform_words(rng, size)
    out: npt.NDArray[np.int64] = _geometric_fast(words, m_lo, m_hi)
    if size != 1 or out[0] < 0:  # one draw, decided: the service's case, without a scan
        for i in np.flatnonzero(out < 0):
            out[i] = _geometric_slow(gamma, int(words[i]), rng)
    return out


def _geometric_slow(gamma: float, prefix: int, rng: np.random.Generator) -> int:
    """1 + ⌊ln U / ln(1 − γ)⌋ in decimal, U's cell [prefix, prefix + 1)·2^−bits exact (it needs
    fewer than bits + 2 digits) and three correctly rounded operations at ``prec`` digits (within
    10^{5−prec} relatively), 64 more bits of U and 40 more digits a round until one floor remains."""
    p = _geometric_rate(gamma)[0]
    bits, prec = 64, 40
    while True:
        if prefix > 0:
            exact = decimal_context(bits + 40)
            ctx = decimal_context(prec)
            m = ctx.minus(ctx.ln(p))
            slack = Decimal(10) ** (5 - prec)
            a_max = ctx.minus(ctx.ln(exact.divide(prefix, 2**bits)))
            a_min = ctx.minus(ctx.ln(exact.divide(prefix + 1, 2**bits)))
            t_max = ctx.multiply(ctx.divide(a_max, m), ctx.add(1, slack))
            t_min = ctx.multiply(ctx.divide(a_min, m), ctx.subtract(1, slack))
            if int(t_min.to_integral_value(decimal.ROUND_FLOOR)) == int(t_max.to_integral_value(decimal.ROUND_FLOOR)):
                return int(t_min.to_integral_value(decimal.ROUND_FLOOR)) + 1
        prefix = prefix * WORD + int(uniform_words(rng, 1)[0])
        bits, prec = bits + 64, prec + 40


@functools.lru_cache(maxsize=64)
def _logarithmic_table(gamma: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(lower, upper) bounds of S_k (k = 1 … K_max) and of L, for the float γ."""
    p = 1.0 - gamma  # within u·p of the real 1 − γ
    log_l = -math.log(gamma)
    # terms to where the tail p^{k+1}/((k+1)(1 − p)) ≤ 2⁻⁷⁰·L, beyond which the slow path extends
    k_max = max(1, min(_MAX_TERMS, math.ceil((70 * math.log(2) + math.log(1 / (gamma * log_l))) / -math.log(p))))
    j = np.arange(1, k_max + 1, dtype=np.float64)
    log_p = math.log(p)
    terms = np.exp(j * log_p) / j
    s = np.cumsum(terms)
    # p's rounding (1.01u in ln p) and log's 4 ulps (8u·|ln p|), times j; the product, exp and
    # division (10u); the sum (1.01k·u): within (3k + 12 + 10k·|ln p|)·u of S_k, relatively
    rel = (3.0 * j + 12.0 + 10.0 * j * abs(log_p)) * _U
    lo, hi = s * (1.0 - rel), s * (1.0 + rel)
    l_rel = 10.0 * _U  # L = −ln γ of the float γ itself: log's 4 ulps and the bounds' roundings
    return lo, hi, log_l * (1.0 - l_rel), log_l * (1.0 + l_rel)


@numba.njit(cache=True, nogil=True)
def _logarithmic_fast(
    words: np.ndarray, lo: np.ndarray, hi: np.ndarray, l_lo: float, l_hi: float
) -> np.ndarray:  # pragma: no cover - numba
    """K for each word whose interval the float table decides (module docstring), else −1: the
    word is within 1 ulp of its float (widened by 4u); a guess (lo is not monotone far in the tail,
    where its error outgrows the terms), checked: S_{k+1} certainly above U·L and S_k certainly not."""
    u = 2.0**-53
    out = np.empty(words.shape[0], dtype=np.int64)
    last = lo.shape[0]
    for i in range(words.shape[0]):
        b = float(words[i])
        t_lo = b * _TO_UNIT * l_lo * (1.0 - 4.0 * u)
        t_hi = (b + 1.0) * _TO_UNIT * l_hi * (1.0 + 4.0 * u)
        k, top = 0, last  # the first k with lo[k] > t_hi, by bisection (lo nondecreasing where it matters)
        while k < top:
            mid = (k + top) // 2
            if lo[mid] > t_hi:
                top = mid
            else:
                k = mid + 1
        if k < last and lo[k] > t_hi and (k == 0 or hi[k - 1] <= t_lo):
            out[i] = k + 1
        else:
            out[i] = -1
    return out


def logarithmic_counts(gamma: float, size: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``size`` draws of K ~ Logarithmic(1 − γ), exactly (module docstring)."""
    lo, hi, l_lo, l_hi = _logarithmic_table(gamma)
    words = uniform_words(rng, size)
    out: npt.NDArray[np.int64] = _logarithmic_fast(words, lo, hi, l_lo, l_hi)
    if size == 1 and out[0] > 0:
        return out
    for i in np.flatnonzero(out < 0):
        out[i] = _logarithmic_slow(gamma, int(words[i]), rng)
    return out


def _logarithmic_slow(gamma: float, prefix: int, rng: np.random.Generator) -> int:
    """The first k with U·L < S_k, in decimal at a precision that grows with U's bits."""
    bits, prec = 64, 40
    g = Decimal(gamma)
    while True:
        ctx = decimal_context(prec)
        p = ctx.subtract(1, g)
        log_l = ctx.minus(ctx.ln(g))
        slack = Decimal(10) ** (4 - prec)
        with decimal.localcontext(ctx):
            unit = Decimal(2) ** -bits
            t_lo = prefix * unit * log_l * (1 - slack)
            t_hi = (prefix + 1) * unit * log_l * (1 + slack)
            s, power, k = Decimal(0), Decimal(1), 0
            s_prev = err_prev = Decimal(0)
            while True:  # S_k rises to L > t_hi: the first S_k beyond t_hi, or one straddling t
                k += 1
                power *= p
                s += power / k
                err = s * slack * k  # a few roundings per term, relative
                if s - err > t_hi:
                    if s_prev + err_prev <= t_lo:
                        return k
                    break
                if s + err > t_lo:  # S_k may lie inside U's interval: refine
                    break
                s_prev, err_prev = s, err
        prefix = prefix * WORD + int(uniform_words(rng, 1)[0])
        bits, prec = bits + 64, prec + 40


class _Replay:
    """A generator that hands out the given cells once (``random``), then the real one's draws:
    the race refines the same uniforms the vectorised pass looked at (their first 53 bits)."""

    def __init__(self, rng: np.random.Generator, cells: npt.NDArray[np.float64]) -> None:
        self.rng, self.cells = rng, cells

    def random(self, size: int) -> npt.NDArray[np.float64]:
        if self.cells.shape[0] != size:
            raise AssertionError("the race asked for other cells than the pass drew")
        return self.cells

    def integers(self, *args: object, **kwargs: object) -> object:
        return self.rng.integers(*args, **kwargs)  # type: ignore[call-overload]  # forwarded as given


@numba.njit(cache=True, nogil=True)
def _lead_records(
    qa: np.ndarray, da: np.ndarray, x: np.ndarray, counts: np.ndarray, c_hat: float, e: float
) -> np.ndarray:  # pragma: no cover - numba
    """For each trial (counts[t] consecutive records, of scores qa and sensitivities da: fresh
    gathers, so the kernel has one signature whatever arrays the caller holds), the position p of
    its first float leader if the float bounds decide it (the leader's lower bound above every
    other record's upper bound), else −1 − p. Record j: base â = fl(fl(q_a − max_t)·ĉ), ĉ = fl(ε/c),
    within 3.01u·|â| (three roundings) plus underflow, scale b = Δ_a (exact), noise F⁻¹ over the
    cell [x, x + 2⁻⁵³) within ``e``; each bound's own roundings are in its 8.02u term. A NaN bound
    (−inf + inf) leaves its trial undecided."""
    u = 2.0**-53
    lead = np.empty(counts.shape[0], dtype=np.int64)
    start = 0
    for t in range(counts.shape[0]):
        stop = start + counts[t]
        top, bottom = -math.inf, math.inf
        for j in range(start, stop):
            top = max(top, qa[j])
            bottom = min(bottom, qa[j])
        tiny = 2.0**-1000 + ((top - bottom) * 2.0**-1070 if c_hat < 2.0**-1000 else 0.0)
        best, v_best, up_best, rest, unknown = -1, -math.inf, -math.inf, -math.inf, False
        for j in range(start, stop):
            scale = da[j]
            base = (qa[j] - top) * c_hat
            z = _signed_log(x[j] + _CELL)
            value = base + scale * z
            upper = value + scale * e + 8.02 * u * (abs(base) + scale * (abs(z) + e)) + tiny
            if math.isnan(value):
                value = -math.inf  # its upper bound is NaN too: the trial stays undecided
            if best < 0 or value > v_best:
                if best >= 0:
                    unknown |= math.isnan(up_best)
                    rest = max(rest, up_best)
                best, v_best, up_best = j, value, upper
            else:
                unknown |= math.isnan(upper)
                rest = max(rest, upper)
        scale = da[best]
        base = (qa[best] - top) * c_hat
        z = _signed_log(x[best])
        lower = base + scale * (z - e) - 8.02 * u * (abs(base) + scale * (abs(z) + e)) - tiny
        lead[t] = best if (not unknown) and lower > rest else -1 - best
        start = stop
    return lead


def uniform_below(n: int, size: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``size`` exactly uniform integers in [0, n), one raw word each but for the rare rejection
    (module docstring): numpy's ``integers`` draws the same law, at ~20 µs a call of argument
    handling, which is a third of a random-stopping selection."""
    words = uniform_words(rng, size)
    least = np.uint64(WORD % n)
    if least:
        bad = np.flatnonzero(words < least)
        while bad.shape[0]:
            words[bad] = uniform_words(rng, bad.shape[0])
            bad = bad[words[bad] < least]
    return (words % np.uint64(n)).astype(np.int64)


def best_record(
    q: np.ndarray, d: np.ndarray, c: int, epsilon: float, counts: npt.NDArray[np.int64], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """For each trial t, counts[t] uniform candidates with records q_a + Laplace(cΔ_a/ε) each,
    and the candidate of the best record, exactly (module docstring). Trials are raced on float
    bounds in one compiled pass; a trial they do not decide is raced alone by the exact race on
    the same cells."""
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if counts.shape[0] == 1:  # the service's case: one trial, no chunks
        return _best_records(q, d, c, epsilon, counts, rng)
    out = np.empty(counts.shape[0], dtype=np.int64)
    first = 0
    while first < counts.shape[0]:
        last = first + 1 + int(np.searchsorted(np.cumsum(counts[first + 1 :]), _CHUNK))
        out[first:last] = _best_records(q, d, c, epsilon, counts[first:last], rng)
        first = last
    return out


def _best_records(
    q: np.ndarray, d: np.ndarray, c: int, epsilon: float, counts: npt.NDArray[np.int64], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    total = int(counts[0]) if counts.shape[0] == 1 else int(counts.sum())
    # a few raw words beat integers' call overhead; for many, its 32-bit Lemire draws cost less
    a = uniform_below(q.shape[0], total, rng) if total < _RAW_CANDIDATES else rng.integers(0, q.shape[0], total)
    x = np.asarray(rng.random(a.shape[0]), dtype=np.float64)  # each record's first 53 bits, as the race draws them
    qa, da = np.asarray(q[a], dtype=np.float64), np.asarray(d[a], dtype=np.float64)
    lead = _lead_records(qa, da, x, counts, epsilon / c, LAPLACE.error)
    if lead[0] >= 0 if lead.shape[0] == 1 else lead.min() >= 0:
        return a[lead]  # type: ignore[no-any-return]  # int64 by construction
    out: npt.NDArray[np.int64] = a[np.where(lead >= 0, lead, -1 - lead)]
    starts = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    for t in np.flatnonzero(lead < 0):
        seg = slice(int(starts[t]), int(starts[t] + counts[t]))
        gap = GapUtilities(qa[seg], epsilon, 1.0, c)  # units of c/ε, as the kernel's
        replay = _Replay(rng, x[seg])
        out[t] = a[seg][int(race_argmax(gap, LAPLACE, replay, 1, da[seg])[0])]  # type: ignore[arg-type]  # a generator's two calls
    return out
