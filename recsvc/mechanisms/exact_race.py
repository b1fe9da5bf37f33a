"""Exact noisy races: the argmax, or the top k, of v_i = a_i + b_i·F⁻¹(U_i) for i.i.d. real
uniforms U_i, decided exactly (``exact_race``: report noisy max and its one-shot top-k relatives).

A float sampler computes v_i in float64 from a 53-bit uniform: exponential noise never exceeds
−log(2⁻⁵³) ≈ 36.7 (≈ 44.4 with 64-bit words), so a candidate whose gap is wider is never chosen
while its neighbour chooses it (δ > 0). Here each U_i is a real number drawn lazily, and the
output is the one the real v_i give: it follows the mechanism's law on the real numbers the
float inputs denote, at every ε.

**Fast path** (float64, vectorised): U_i's first 53 bits are ``rng.random()`` (k·2⁻⁵³, exactly
numpy's double), so U_i lies in the cell [x_i, x_i + 2⁻⁵³). With rigorous float bounds on the
noise over each cell and on the a_i, the race is decided when the leader's lower bound exceeds
every other candidate's upper bound (top k: each of the k leaders' lower bound exceeds the next
one's upper bound; as a set, the k-th's exceeds the (k+1)-th's). Only the k leaders need their
lower bound; every other bound is one float and a shared scalar error.

**Slow path** (:mod:`decimal`): the candidates the float bounds cannot rule out get 64 more bits
of their U each round and enclosures of a_i and F⁻¹ at a precision that grows, until the order
is certain. Refining some U_i's bits never changes the law: the output is a function of the real
uniforms, revealed only as far as needed. Ties have probability 0 (continuous noise), so the
loop ends almost surely; it runs on about one draw in 10¹⁰ (the width of the float error band).

API (what a mechanism supplies):

* :class:`Utilities` — the a_i: ``value`` (float64, with ``value_i + err ≥ a_i``), ``lower(idx)``
  (rigorous lower bounds at a few indices) and ``exact(idx, prec)`` (decimal enclosures whose
  width shrinks with prec). :func:`gap_utilities` builds them for a_i = (q_i − max q)·ε/(m·Δmax).
* :class:`Noise` — F⁻¹ on cells: ``sup(x)`` (float64 sup over each cell, within ``error``;
  inf allowed), ``width(x)`` (rigorous bound on sup − inf over each cell), ``magnitude`` (bound on
  |sup| of every finite cell) and ``enclose(lo, hi, ctx)`` (decimal bounds of F⁻¹ on [lo, hi]).
  :data:`EXPONENTIAL` is E = −ln U (standard exponential); Laplace or Gumbel plug in the same way.
* :func:`race_argmax` (``size`` independent argmaxes, one row of uniforms each) and
  :func:`race_top_k` (one draw of the k largest, in order or as a set), with b_i > 0 given
  exactly as floats (``scale``; None: every b_i = 1).

Assumption: numpy's float64 ``log`` is within 4 ulps (its measured error is below 1 ulp), as
:mod:`recsvc.mechanisms.exact_sampling` assumes of ``exp``; :mod:`decimal`'s ``ln`` and ``exp``
are correctly rounded by specification. The stand-in generator
:class:`recsvc.mechanisms.testing.Words` drives every path with chosen words.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF, WORD, decimal_context, uniform_words

_U = UNIT_ROUNDOFF
_FIRST_BITS = 53  # rng.random() is k·2⁻⁵³ with k a uniform 53-bit integer
_CELL = 2.0**-_FIRST_BITS
_TINY = 2.0**-1060  # covers every float64 underflow in the bounds below
_FLOOR, _CEILING = decimal.ROUND_FLOOR, decimal.ROUND_CEILING

Enclosure = tuple[Decimal, Decimal]


@dataclass(frozen=True)
class Utilities:
    """The a_i of a race: float64 ``value`` with a_i ≤ value_i + err for every i; ``lower(idx)``
    rigorous lower bounds of a_idx (a float64 array); ``exact(idx, prec)`` decimal enclosures
    (lo, hi) of a_idx whose width → 0 as prec → ∞ (about prec significant digits)."""

    value: npt.NDArray[np.float64]
    err: float
    lower: Callable[[npt.NDArray[np.intp]], npt.NDArray[np.float64]]
    exact: Callable[[Sequence[int], int], list[Enclosure]]


class Noise(Protocol):
    """A noise law by its inverse CDF F⁻¹ (monotone) on the cells [x, x + 2⁻⁵³) of U's first
    53 bits, and on decimal intervals for the slow path."""

    error: float  # |sup(x) − sup of F⁻¹ on the cell| ≤ error wherever that sup is finite
    magnitude: float  # |sup of F⁻¹ on the cell| ≤ magnitude wherever it is finite

    def sup(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...

    def width(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...

    def enclose(self, lo: Decimal, hi: Decimal, prec: int) -> Enclosure: ...


_SMALLEST = Decimal(f"1e{decimal.MIN_EMIN - 100}")  # below any decimal result's absolute error


def widen(x: Decimal, prec: int) -> Enclosure:
    """[x − s, x + s] with s ≥ the error of a few correctly rounded operations at ``prec``
    digits that gave x (relative 10^{3−prec}), rounded outwards."""
    s = decimal_context(8, _CEILING).multiply(abs(x), Decimal(10) ** (3 - prec)) if x.is_finite() else Decimal(0)
    s = decimal_context(8, _CEILING).add(s, _SMALLEST)
    if not x.is_finite():
        return x, x
    return decimal_context(prec, _FLOOR).subtract(x, s), decimal_context(prec, _CEILING).add(x, s)


@dataclass(frozen=True)
class ExponentialNoise:
    """E = −ln U, a standard exponential (decreasing in U: the cell's sup is at x)."""

    error: float = 8.0 * _U * 37.0  # 4 ulps of |log x| ≤ 36.8 (x ≥ 2⁻⁵³)
    magnitude: float = 37.0

    def sup(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        with np.errstate(divide="ignore"):  # x = 0: sup = inf, left to the slow path
            out: npt.NDArray[np.float64] = -np.log(x)
        return out

    def width(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        # ln(x + c) − ln x = ln1p(c/x) ≤ c/x, with the division's rounding
        with np.errstate(divide="ignore"):
            out: npt.NDArray[np.float64] = (_CELL / x) * (1.0 + 4.0 * _U)
        return out

    def enclose(self, lo: Decimal, hi: Decimal, prec: int) -> Enclosure:
        ctx = decimal_context(prec)
        top = Decimal("Infinity") if lo == 0 else ctx.minus(ctx.ln(lo))
        bottom = ctx.minus(ctx.ln(hi)) if hi < 1 else Decimal(0)
        return widen(bottom, prec)[0], widen(top, prec)[1]


EXPONENTIAL = ExponentialNoise()


def gap_utilities(q: np.ndarray, epsilon: float, d_max: float, m: int = 2) -> Utilities:
    """a_i = (q_i − max q)·ε/(m·Δmax) ≤ 0 on the real numbers the floats denote (rnm: m = 2).

    ``value`` is computed with ε/(m·Δmax) shrunk by 16u, so it is an upper bound of the real a_i
    (all ≤ 0) up to underflow; ``lower`` grows it back by 40u."""
    top = float(q.max())
    c_hat = (epsilon / m) / d_max
    value: npt.NDArray[np.float64] = (q - top) * (c_hat * (1.0 - 16.0 * _U))
    spread = top - float(q.min())
    # A subnormal c_hat has no relative bound: its absolute error times the spread covers it.
    err = _TINY + (spread * 2.0**-1070 if c_hat < 2.0**-1000 else 0.0)

    def lower(idx: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = value[idx] * (1.0 + 40.0 * _U) - err
        return out

    def exact(idx: Sequence[int], prec: int) -> list[Enclosure]:
        ctx = decimal_context(prec)
        scale = ctx.divide(Decimal(epsilon), ctx.multiply(m, Decimal(d_max)))
        t = Decimal(top)
        out = []
        for i in idx:
            out.append(widen(ctx.multiply(ctx.subtract(Decimal(float(q[i])), t), scale), prec))
        return out

    return Utilities(value, err, lower, exact)


def _cells(rng: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
    x: npt.NDArray[np.float64] = rng.random(shape)
    return x


def _upper_error(a: Utilities, noise: Noise, b_max: float) -> float:
    """E with v_j ≤ v̂_j + 1.01u·|v̂_j| + E for v̂ = fl(value + fl(b·sup)) (module docstring)."""
    return a.err + b_max * (noise.error + 1.01 * _U * noise.magnitude) + _TINY


def race_argmax(
    a: Utilities, noise: Noise, rng: np.random.Generator, size: int, scale: np.ndarray | None = None
) -> npt.NDArray[np.intp]:
    """``size`` independent draws of argmax_i (a_i + b_i·F⁻¹(U_i)), exactly (module docstring)."""
    n = a.value.shape[0]
    x = _cells(rng, (size, n))
    z = noise.sup(x)
    v = a.value + (z if scale is None else scale * z)
    rows = np.arange(size)
    top: npt.NDArray[np.intp] = v.argmax(axis=1)
    lead = _lower_at(a, noise, scale, top, x[rows, top], z[rows, top])
    e_up = _upper_error(a, noise, 1.0 if scale is None else float(scale.max()))
    v_top = v[rows, top].copy()
    v[rows, top] = -np.inf
    second = v.max(axis=1) if n > 1 else np.full(size, -np.inf)
    decided = lead > second + 1.01 * _U * np.abs(second) + e_up
    if n == 1:
        decided[:] = True
    for r in np.flatnonzero(~decided):
        v[r, top[r]] = v_top[r]
        top[r] = _slow_row(a, noise, scale, x[r], v[r], lead[r], e_up, rng, 1, True)[0]
    return top


def race_top_k(
    a: Utilities,
    noise: Noise,
    rng: np.random.Generator,
    k: int,
    ordered: bool = True,
    scale: np.ndarray | None = None,
) -> npt.NDArray[np.intp]:
    """One draw of the k largest a_i + b_i·F⁻¹(U_i), exactly: by decreasing value if
    ``ordered``, else as a set (ascending indices)."""
    n = a.value.shape[0]
    x = _cells(rng, (n,))
    z = noise.sup(x)
    v = a.value + (z if scale is None else scale * z)
    e_up = _upper_error(a, noise, 1.0 if scale is None else float(scale.max()))
    if k >= n:
        lead_idx: npt.NDArray[np.intp] = np.argsort(-v, kind="stable")
        rest = -np.inf
    else:
        part = np.argpartition(-v, k)
        lead_idx = part[:k][np.argsort(-v[part[:k]], kind="stable")]
        rest = float(v[part[k]])
    lead_idx = lead_idx[:k]
    lo = _lower_at(a, noise, scale, lead_idx, x[lead_idx], z[lead_idx])
    hi = v[lead_idx] + 1.01 * _U * np.abs(v[lead_idx]) + e_up
    rest_hi = rest + 1.01 * _U * abs(rest) + e_up
    # ordered: each leader certainly ahead of the next; a set: the k-th ahead of the rest
    ok = bool((lo[:-1] > hi[1:]).all() and lo[-1] > rest_hi) if ordered else bool(lo.min() > rest_hi)
    if not ok:
        lead_idx = np.asarray(_slow_row(a, noise, scale, x, v, float(lo.min()), e_up, rng, k, ordered), dtype=np.intp)
    return lead_idx if ordered else np.sort(lead_idx)


def _lower_at(
    a: Utilities,
    noise: Noise,
    scale: np.ndarray | None,
    idx: npt.NDArray[np.intp],
    x: npt.NDArray[np.float64],
    z: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Rigorous lower bounds of v_idx = a_idx + b_idx·F⁻¹(U_idx) for U_idx in the cells x:
    (lower a) + b·(sup − error − width), less 4u of the magnitudes for its 4 roundings."""
    la = a.lower(idx)
    b = np.ones(idx.shape[0]) if scale is None else scale[idx]
    w = noise.width(x)
    with np.errstate(invalid="ignore"):  # inf − inf (a cell at 0): NaN, never decided
        noise_lo = z - noise.error - w
        out: npt.NDArray[np.float64] = la + b * noise_lo - 4.0 * _U * (np.abs(la) + b * (np.abs(z) + w)) - _TINY
    return out


def _slow_row(
    a: Utilities,
    noise: Noise,
    scale: np.ndarray | None,
    x: npt.NDArray[np.float64],
    v: npt.NDArray[np.float64],
    lead: float,
    e_up: float,
    rng: np.random.Generator,
    k: int,
    ordered: bool,
) -> list[int]:
    """The k leaders of one row, decided in decimal. Candidates: every j whose float upper bound
    reaches ``lead`` (a lower bound of the k-th leader); the others are certainly behind."""
    if math.isfinite(lead):
        alive = [int(j) for j in np.flatnonzero(v + 1.01 * _U * np.abs(v) + e_up >= lead)]
    else:
        alive = list(range(v.shape[0]))
    prefix = {j: int(x[j] * 2.0**_FIRST_BITS) for j in alive}
    bits = _FIRST_BITS
    prec = 40 + max(0, int(math.log10(max(1.0, float(np.abs(a.value).max())))))
    while True:
        lo, hi = _enclose_row(a, noise, scale, alive, prefix, bits, prec)
        order = sorted(range(len(alive)), key=lambda i: lo[i], reverse=True)
        done = _decided(order, lo, hi, k, ordered)
        if done:
            return [alive[i] for i in order[:k]]
        # drop the candidates at least k others certainly beat
        keep = [i for i in range(len(alive)) if sum(1 for j in range(len(alive)) if lo[j] > hi[i]) < k]
        alive = [alive[i] for i in keep]
        fresh = uniform_words(rng, len(alive))
        for j, word in zip(alive, fresh.tolist(), strict=True):
            prefix[j] = prefix[j] * WORD + int(word)
        bits += 64
        prec += 25


def _enclose_row(
    a: Utilities,
    noise: Noise,
    scale: np.ndarray | None,
    alive: list[int],
    prefix: dict[int, int],
    bits: int,
    prec: int,
) -> tuple[list[Decimal], list[Decimal]]:
    """Decimal enclosures of v_j for the alive candidates, from U_j's ``bits``-bit prefixes."""
    down, up = decimal_context(prec, _FLOOR), decimal_context(prec, _CEILING)
    cell = Decimal(2) ** bits  # exact: a power of two has as many digits as it needs
    enc = a.exact(alive, prec)
    lo, hi = [], []
    for j, (alo, ahi) in zip(alive, enc, strict=True):
        u_lo = down.divide(prefix[j], cell)
        u_hi = up.divide(prefix[j] + 1, cell)
        n_lo, n_hi = noise.enclose(u_lo, u_hi, prec)
        b = Decimal(1) if scale is None else Decimal(float(scale[j]))
        lo.append(down.add(alo, down.multiply(b, n_lo)))
        hi.append(up.add(ahi, up.multiply(b, n_hi)))
    return lo, hi


def _decided(order: list[int], lo: list[Decimal], hi: list[Decimal], k: int, ordered: bool) -> bool:
    """Whether the k first of ``order`` (by lower bound, decreasing) are certainly the k largest
    (``ordered``: certainly in that order)."""
    rest = [hi[i] for i in order[k:]]
    rest_max = max(rest) if rest else Decimal("-Infinity")
    if ordered:
        return all(lo[order[r]] > max([hi[i] for i in order[r + 1 :]], default=Decimal("-Infinity")) for r in range(k))
    return min(lo[i] for i in order[:k]) > rest_max
