"""Random stopping sampled exactly: the number of draws K, the candidates and the best noisy
record, each from its real-number law (``rs``, ``rs_improved``; random_stopping.py has the
mechanisms and their proofs).

* **K for rs**, Geometric(γ) on {1, 2, …}: the index of the first of i.i.d. Bernoulli(γ) trials
  that succeeds. A trial is a real uniform U < γ, decided by its 64-bit prefix w against
  G = ⌊γ·2⁶⁴⌋ (w < G: yes, w > G: no) and, when w = G, by more bits against γ's exact binary
  value (:func:`~recsvc.mechanisms.exact_sampling.is_below`).
* **K for rs_improved**, Logarithmic(1 − γ): P(K = k) = p^k / (k·L), p = 1 − γ, L = ln(1/γ), by
  inverse CDF: K is the first k with U·L < S_k = Σ_{j ≤ k} p^j / j. The float S_k (terms
  exp(j·ln p̂)/j and their cumulative sum: within (3k + 12 + 10k·|ln p|)·u relatively, p̂ = fl(1 − γ)
  included) and L = −ln γ (one ``log``, within 10u) bound the exact ones; a 64-bit prefix of U whose
  interval lies strictly between two bounded S's decides K. Otherwise, and beyond the last term
  computed, :mod:`decimal` does the same comparison at a precision that grows with U's bits.
* **The candidates** are ``rng.integers(0, n)``: numpy draws bounded integers by rejection on raw
  bits (Lemire's method), exactly uniform.
* **The best record**, argmax_j q_{a_j} + (cΔ_{a_j}/ε)·L_j with L_j ~ Laplace(1), is an exact
  race: a batch's records are raced together on float bounds of each record over its 53-bit
  cell (a trial is decided when its float leader's lower bound clears every other record's upper
  bound), and a trial they do not decide goes to
  :func:`~recsvc.mechanisms.exact_race.race_argmax` with Laplace noise on the same cells. In units of
  cΔmax/ε, utilities (q_{a_j} − max)·ε/(cΔmax) and noise scales b_j = Δ_{a_j}/Δmax rounded UP
  to a float. A scale at least the proof's keeps every record an (ε/c)-DP release of its
  candidate (Laplace of scale ≥ cΔ_a/ε for sensitivity Δ_a), which is all the stopping theorems
  ask of the base mechanism, so the law drawn is one the proofs cover exactly.
"""

from __future__ import annotations

import decimal
import functools
import math
from decimal import Decimal

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_noise import LAPLACE
from recsvc.mechanisms.exact_race import GapUtilities, race_argmax
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.mechanisms.exact_sampling import WORD, decimal_context, is_below, uniform_words

_BLOCK = 256  # Bernoulli trials' words drawn at a time, at least
_MAX_BLOCK = 1 << 22  # and at most (32 MB of words)
_CHUNK = 1 << 18  # records raced per vectorised pass (best_record)
_MAX_TERMS = 2_000_000  # the float table's length at most (γ ≥ 2⁻¹⁸ needs fewer); beyond, decimal


def geometric_counts(gamma: float, size: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``size`` draws of K ~ Geometric(γ) on {1, 2, …}, exactly (module docstring): the gaps
    between successive successes in one sequence of Bernoulli(γ) trials, one word each."""
    g = math.floor(Decimal(gamma) * WORD)  # exact: γ is a dyadic rational below 1
    exact_g = Decimal(gamma)
    parts: list[npt.NDArray[np.int64]] = []
    have, run = 0, 0  # counts so far; trials since the last success
    while have < size:
        block = min(max(_BLOCK, math.ceil((size - have) / gamma * 1.1)), _MAX_BLOCK)
        words = uniform_words(rng, block)
        hit = words < np.uint64(g)
        for t in np.flatnonzero(words == np.uint64(g)):  # rare (2⁻⁶⁴ a trial): more bits decide
            hit[t] = is_below(lambda prec: (exact_g, exact_g), g, 64, rng)
        pos = np.flatnonzero(hit)
        if pos.shape[0] == 0:
            run += block
            continue
        take = min(pos.shape[0], size - have)
        gaps = np.empty(take, dtype=np.int64)
        gaps[0] = int(pos[0]) + 1 + run
        np.subtract(pos[1:take], pos[: take - 1], out=gaps[1:])
        parts.append(gaps)
        have += take
        run = block - 1 - int(pos[-1])
    return np.concatenate(parts)


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


def logarithmic_counts(gamma: float, size: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``size`` draws of K ~ Logarithmic(1 − γ), exactly (module docstring)."""
    lo, hi, l_lo, l_hi = _logarithmic_table(gamma)
    words = uniform_words(rng, size)
    b = words.astype(np.float64)  # within 1 ulp of the word: widened by 4u
    t_lo = b * 2.0**-64 * l_lo * (1.0 - 4 * _U)
    t_hi = (b + 1.0) * 2.0**-64 * l_hi * (1.0 + 4 * _U)
    # a guess (lo is not monotone far in the tail, where its error outgrows the terms), checked:
    # S_{k+1} certainly above U·L and S_k certainly not
    k = np.searchsorted(lo, t_hi, side="right")
    inside = k < lo.shape[0]
    kk = np.minimum(k, lo.shape[0] - 1)
    ok = inside & (lo[kk] > t_hi) & ((k == 0) | (hi[np.maximum(kk - 1, 0)] <= t_lo))
    out = (k + 1).astype(np.int64)
    for i in np.flatnonzero(~ok):
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


def best_record(
    q: np.ndarray, d: np.ndarray, c: int, epsilon: float, counts: npt.NDArray[np.int64], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """For each trial t, counts[t] uniform candidates with records q_a + Laplace(cΔ_a/ε) each,
    and the candidate of the best record, exactly (module docstring). Trials are raced together
    on float bounds; a trial they do not decide is raced alone by the exact race on the same cells."""
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
    n, d_max = q.shape[0], float(d.max())
    a = rng.integers(0, n, int(counts.sum()))
    scale = np.minimum(np.nextafter(d[a] / d_max, np.inf), 1.0)  # rounded up: ≥ Δ_a/Δmax; Δmax: 1
    x = np.asarray(rng.random(a.shape[0]), dtype=np.float64)  # each record's first 53 bits, as the race draws them
    c_hat = (epsilon / c) / d_max
    # â within 4.01u·|â| of the real (q_a − max q)·ε/(cΔmax) (four roundings), plus underflow
    tiny = 2.0**-1000 + ((float(q.max()) - float(q.min())) * 2.0**-1070 if c_hat < 2.0**-1000 else 0.0)
    base = (q[a] - q.max()) * c_hat
    hi_n, e = LAPLACE.sup(x), LAPLACE.error
    with np.errstate(invalid="ignore"):  # an infinite noise bound stays infinite (no NaN: b > 0)
        value = base + scale * hi_n
        upper = value + scale * e + 8.02 * _U * (np.abs(base) + scale * (np.abs(hi_n) + e)) + tiny
    value[np.isnan(value)] = -np.inf  # −inf + inf: its bounds are NaN too, so its trial stays undecided
    if counts.shape[0] == 1:  # the service's case: one trial, no segments
        lead = np.array([int(value.argmax())])
        upper[lead] = -np.inf
        rest = np.array([upper.max()])
        starts = np.zeros(1, dtype=np.int64)
    else:
        starts = np.zeros(counts.shape[0], dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        seg_max = np.maximum.reduceat(value, starts)
        hits = np.flatnonzero(value == np.repeat(seg_max, counts))
        lead = hits[np.searchsorted(hits, starts)]  # each trial's first float leader
        upper[lead] = -np.inf
        rest = np.maximum.reduceat(upper, starts)  # the best upper bound among the others
    b_l, s_l, lo_n = base[lead], scale[lead], LAPLACE.inf(x[lead])
    with np.errstate(invalid="ignore"):
        lower = b_l + s_l * (lo_n - e) - 8.02 * _U * (np.abs(b_l) + s_l * (np.abs(lo_n) + e)) - tiny
    out: npt.NDArray[np.int64] = a[lead]
    for t in np.flatnonzero(~(lower > rest)):
        seg = slice(int(starts[t]), int(starts[t] + counts[t]))
        gap = GapUtilities(q[a[seg]], epsilon, d_max, c)
        replay = _Replay(rng, x[seg])
        out[t] = a[seg][int(race_argmax(gap, LAPLACE, replay, 1, scale[seg])[0])]  # type: ignore[arg-type]  # a generator's two calls
    return out
