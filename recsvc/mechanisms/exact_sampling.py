"""Exact sampling for ``em`` and ``krr``: their outputs follow the mechanism's law on the real
numbers the float inputs denote, at every ε, so they are pure ε-DP with δ = 0 at the float level.

Sampling by inverse CDF from float64 probabilities is not: a 53-bit uniform puts every output's
probability on a grid of 2⁻⁵³, so at large ε an output whose true probability is tiny gets 0 on
one input and 2⁻⁵³ on its neighbour (δ > 0; ``krr`` at ε = 37.5 could never return most items).

Here the uniform U is real and drawn lazily, 64 bits at a time, and the output is decided by
comparing U with the exact cumulative probabilities, known only to within rigorous error bounds:

* **fast path** (float64): the cumulative weights with a bound on their error
  (:func:`_em_error`). A 64-bit prefix of U whose whole interval lies inside one output's interval
  decides it; that is all but a ~n·10⁻¹³ fraction of draws.
* **slow path** (:mod:`decimal`, correctly rounded ``exp``): the same comparison at a precision
  that grows, with 64 more bits of U each round, until the prefix decides. A prefix that is still
  undecided has probability about the width of the error band, so the expected cost is nil.

Within ``krr``'s chosen group (the tied maxima, or the others) the item is ``rng.integers``, which
is exactly uniform. Assumption: numpy's float64 ``exp`` is within 4 ulps (its measured error is
below 1 ulp); :mod:`decimal`'s ``exp`` is correctly rounded by specification.
"""

from __future__ import annotations

import bisect
import decimal
import math
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from randomgen import ChaCha

UNIT_ROUNDOFF = 2.0**-53  # unit roundoff of float64
WORD = 2**64
_TINY = 2.0**-1070  # bounds any float64 exp result's absolute error below the normal range


# Bit generators whose raw output is one uniform 64-bit word (MT19937's is 32 bits): for them
# ``random_raw`` gives the words ``integers(0, 2**64, dtype=uint64)`` would, without its ~20 µs of
# argument handling for a bound above int64.
_RAW64 = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64, ChaCha)


def uniform_words(rng: np.random.Generator, size: int) -> npt.NDArray[np.uint64]:
    """``size`` uniform 64-bit words: the next 64 bits of a lazily drawn real uniform each."""
    bits = getattr(rng, "bit_generator", None)
    if type(bits) in _RAW64:
        return bits.random_raw(size)  # type: ignore[union-attr, no-any-return]  # one of _RAW64's
    return rng.integers(0, WORD, size=size, dtype=np.uint64)


def decimal_context(prec: int, rounding: str = decimal.ROUND_HALF_EVEN) -> decimal.Context:
    """A :mod:`decimal` context of ``prec`` digits whose exponents never overflow or underflow."""
    return decimal.Context(prec=prec, rounding=rounding, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


# --- krr -------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _krr_other(epsilon: float, n: int, k: int, prec: int) -> tuple[Decimal, Decimal]:
    """Bounds lo ≤ r ≤ hi of r = P(not a maximum) = (n − k)e^{−ε} / (1 + (n − 1)e^{−ε}).
    Five correctly rounded operations: the relative error is below 3·10^{1−prec} ≤ 10^{3−prec}."""
    ctx = decimal_context(prec)
    e = ctx.exp(-Decimal(epsilon))
    r = ctx.divide(ctx.multiply(n - k, e), ctx.add(1, ctx.multiply(n - 1, e)))
    slack = Decimal(10) ** (3 - prec)
    return r * (1 - slack), r * (1 + slack)


@lru_cache(maxsize=1024)
def _krr_thresholds(epsilon: float, n: int, k: int) -> tuple[int, int]:
    """(L, H) on 64-bit words B: B < L certainly U < r, B ≥ H certainly U ≥ r."""
    return _scaled(*_krr_other(epsilon, n, k, 40), 64)


def _scaled(lo: Decimal, hi: Decimal, bits: int) -> tuple[int, int]:
    """(⌊lo·2^bits⌋, ⌈hi·2^bits⌉), rounded outwards."""
    p = Decimal(2**bits)
    low = decimal_context(60 + bits, decimal.ROUND_FLOOR).multiply(lo, p).to_integral_value(decimal.ROUND_FLOOR)
    high = decimal_context(60 + bits, decimal.ROUND_CEILING).multiply(hi, p).to_integral_value(decimal.ROUND_CEILING)
    return int(low), int(high)


def _krr_is_other(epsilon: float, n: int, k: int, prefix: int, rng: np.random.Generator) -> bool:
    """Whether U < r, for U starting with the 64-bit ``prefix``: refine until decided."""
    return is_below(lambda prec: _krr_other(epsilon, n, k, prec), prefix, 64, rng)


def is_below(
    bounds: Callable[[int], tuple[Decimal, Decimal]], prefix: int, bits: int, rng: np.random.Generator
) -> bool:
    """Whether U < r, for a real uniform U whose first ``bits`` bits are ``prefix``, given
    ``bounds(prec)`` = (lo, hi) with lo ≤ r ≤ hi, tightening as prec grows: 64 more bits of U and
    40 more digits each round until the prefix's interval lies on one side of the bounds. This
    is a Bernoulli(r) trial, exact whatever r's float value would have been."""
    prec = 40
    while True:
        low, high = _scaled(*bounds(prec), bits)
        if prefix + 1 <= low:
            return True
        if prefix >= high:
            return False
        prefix = prefix * WORD + int(uniform_words(rng, 1)[0])
        bits, prec = bits + 64, prec + 40


def exact_bernoulli(
    bounds: Callable[[int], tuple[Decimal, Decimal]], rng: np.random.Generator, size: int
) -> npt.NDArray[np.bool_]:
    """``size`` exact Bernoulli(r) trials, r known by ``bounds(prec)`` (see :func:`is_below`;
    pass the same ``bounds`` object each time: its first thresholds are cached): U's first 53 bits
    are ``rng.random()`` (k·2⁻⁵³), decided by r's 40-digit bounds unless the cell straddles them."""
    low, high = _first_thresholds(bounds)
    cells = (rng.random(size) * 2.0**53).astype(np.int64)  # exact: k·2⁻⁵³ · 2⁵³ = k
    out: npt.NDArray[np.bool_] = cells < low  # the whole cell lies below r's lower bound
    for i in np.flatnonzero(~out & (cells < high)).tolist():  # straddles: refine, in draw order
        out[i] = is_below(bounds, int(cells[i]), 53, rng)
    return out


@lru_cache(maxsize=256)
def _first_thresholds(bounds: Callable[[int], tuple[Decimal, Decimal]]) -> tuple[int, int]:
    return _scaled(*bounds(40), 53)


def krr_exact_sample(q: np.ndarray, epsilon: float, rng: np.random.Generator, size: int) -> npt.NDArray[np.intp]:
    """k-ary randomised response on the argmax of q (ties: the k maxima share the top mass),
    sampled exactly: one of the n − k others with probability r, uniformly within the group."""
    n = q.shape[0]
    is_top = q == q.max()
    k = int(is_top.sum())
    if k == n:
        return rng.integers(0, n, size)
    eps = float(epsilon)
    low, high = _krr_thresholds(eps, n, k)
    words = uniform_words(rng, size)
    if size == 1:  # the service's case, in Python ints
        word = int(words[0])
        other_one = word < low or (word < high and _krr_is_other(eps, n, k, word, rng))
        group = np.flatnonzero(~is_top if other_one else is_top)
        return np.array([group[int(rng.integers(0, group.shape[0]))]], dtype=np.intp)
    other = words < np.uint64(low) if low > 0 else np.zeros(size, dtype=bool)
    certain = other | (words >= np.uint64(high)) if high < WORD else other.copy()
    for i in np.flatnonzero(~certain):
        other[i] = _krr_is_other(eps, n, k, int(words[i]), rng)
    out = np.empty(size, dtype=np.intp)
    n_other = int(other.sum())
    out[other] = np.flatnonzero(~is_top)[rng.integers(0, n - k, n_other)]
    out[~other] = np.flatnonzero(is_top)[rng.integers(0, k, size - n_other)]
    return out


# --- em --------------------------------------------------------------------------------------------


def _em_error(x: np.ndarray) -> tuple[float, float]:
    """(R, A): |Ŝ_a − S_a| ≤ R·S_a + A for the float cumulative weights Ŝ of exp(x̂) against the
    exact S of exp(x). x̂ = (q − q*)·(ε/(2Δ)) has relative error ≤ 3u, so exp(x̂) is off by a factor
    within 3.02u·|x| (plus exp's own 8u); the cumulative sum adds ≤ 1.01·n·u; the bounds' own
    arithmetic is covered by another 32u. Weights below the normal range are off by at most A/n."""
    n = x.shape[0]
    reach = min(float(-x.min()), 746.0)  # beyond, exp(x) < 2^-1075: inside A
    return (3.02 * reach + 8.0 + 1.01 * n + 32.0) * UNIT_ROUNDOFF, 2.0 * n * _TINY


def em_exact_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """P(a) ∝ exp(ε (q_a − q*) / (2Δmax)), sampled exactly (module docstring)."""
    x = (q - q.max()) * (epsilon / (2.0 * d.max()))
    cdf = np.cumsum(np.exp(x))
    total = float(cdf[-1])
    rel, ab = _em_error(x)
    words = uniform_words(rng, size)
    if size == 1:  # the service's case: the same test in Python floats, without array temporaries
        return np.array([_em_one(q, d, epsilon, cdf, total, rel, ab, int(words[0]), rng)], dtype=np.intp)
    b = words.astype(np.float64)  # within 1 ulp of the word: widened by 2u below
    step = 2.0**-64 * total
    t = b * step
    lo_t = t * ((1.0 - 2 * UNIT_ROUNDOFF) * (1.0 - rel)) - ab
    hi_t = t * ((1.0 + 2 * UNIT_ROUNDOFF) * (1.0 + rel)) + (step * (1.0 + rel) + ab)
    idx = np.minimum(np.searchsorted(cdf, t + 0.5 * step, side="right"), q.shape[0] - 1)
    above = np.concatenate(([0.0], cdf[:-1] * (1.0 + rel) + ab))  # upper bound of S_{a−1}
    below = cdf * (1.0 - rel) - ab  # lower bound of S_a
    out: npt.NDArray[np.intp] = idx.astype(np.intp)
    for i in np.flatnonzero(~((lo_t >= above[idx]) & (hi_t < below[idx]))):
        out[i] = _em_slow(q, d, epsilon, int(words[i]), rng)
    return out


def _em_one(
    q: np.ndarray,
    d: np.ndarray,
    epsilon: float,
    cdf: np.ndarray,
    total: float,
    rel: float,
    ab: float,
    word: int,
    rng: np.random.Generator,
) -> int:
    b = float(word)
    lo_t = b * (1.0 - 2 * UNIT_ROUNDOFF) * 2.0**-64 * total * (1.0 - rel) - ab
    hi_t = (b * (1.0 + 2 * UNIT_ROUNDOFF) + 1.0) * 2.0**-64 * total * (1.0 + rel) + ab
    a: int = min(int(cdf.searchsorted((b + 0.5) * 2.0**-64 * total, side="right")), int(q.shape[0]) - 1)
    above_prev = float(cdf[a - 1]) * (1.0 + rel) + ab if a > 0 else 0.0
    if lo_t >= above_prev and hi_t < float(cdf[a]) * (1.0 - rel) - ab:
        return a
    return _em_slow(q, d, epsilon, word, rng)


# Twice a float's decimal expansion (at most 767 significant digits) is exact at 800 digits; the
# default 28-digit context would round it outside the error bound below.
_EXACT = decimal.Context(prec=800, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


def _em_slow(q: np.ndarray, d: np.ndarray, epsilon: float, prefix: int, rng: np.random.Generator) -> int:
    """The output for U starting with the 64-bit ``prefix``, from decimal cumulative weights at a
    precision that grows (with more bits of U) until the prefix's interval fits one output."""
    qs = [Decimal(float(v)) for v in q]
    top = max(qs)
    reach = float((q.max() - q.min()) * (epsilon / (2.0 * d.max())))
    digits = max(1, math.ceil(math.log10(reach + 1.0)))
    n = len(qs)
    bits, extra = 64, 30
    while True:
        prec = digits + extra
        ctx = decimal_context(prec)
        scale = ctx.divide(Decimal(epsilon), _EXACT.multiply(2, Decimal(float(d.max()))))
        cum, total = [], Decimal(0)
        for v in qs:
            total = ctx.add(total, ctx.exp(ctx.multiply(ctx.subtract(v, top), scale)))
            cum.append(total)
        # Three roundings in x (≤ 1.5·|x|·10^{1−prec}), one in exp and one per sum; ×10 for the bounds' own.
        with decimal.localcontext(ctx):
            rel = Decimal(2 * reach + n + 20) * Decimal(10) ** (2 - prec)
            ab = n * Decimal(10) ** (decimal.MIN_EMIN - prec)
            unit = Decimal(2) ** -bits
            lo_t = prefix * unit * total * (1 - rel) - ab
            hi_t = (prefix + 1) * unit * total * (1 + rel) + ab
            a = min(bisect.bisect_right(cum, (prefix + Decimal("0.5")) * unit * total), n - 1)
            prev = cum[a - 1] * (1 + rel) + ab if a > 0 else Decimal(0)
            if lo_t >= prev and hi_t < cum[a] * (1 - rel) - ab:
                return a
        prefix = prefix * WORD + int(uniform_words(rng, 1)[0])
        bits, extra = bits + 64, extra + 30
