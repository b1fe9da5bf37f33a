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

* :class:`Utilities` — the a_i: ``value`` (float64, with ``value_i + err ≥ a_i``), ``lower(i)``
  (a rigorous lower bound, for the few leaders) and ``exact(idx, prec)`` (decimal enclosures whose
  width shrinks with prec). :class:`GapUtilities` is a_i = (q_i − max q)·ε/(m·Δmax).
* :class:`Noise` — F⁻¹ on cells: ``sup(x)`` and ``sup_at(x)`` (float64 sup over each cell,
  within ``error``; inf allowed), ``inf_at(x)`` (the float64 inf over the cell at a float x,
  within ``error``), ``magnitude`` (a bound on |sup| of every finite cell) and ``enclose(lo, hi, prec)``
  (decimal bounds of F⁻¹ on [lo, hi]). :data:`EXPONENTIAL` is E = −ln U (standard exponential);
  Laplace or Gumbel plug in the same way. A noise may also supply ``gap_race(a, scale, x, e_up)``,
  the float check below compiled for :class:`GapUtilities` over rows of cells (each row's leader,
  or −1 − leader where its bounds do not decide; :data:`recsvc.mechanisms.exact_noise.LAPLACE`
  does): the race then runs it, and the rows it leaves undecided go the usual way on their cells.
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

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF, WORD, decimal_context, uniform_words
from recsvc.mechanisms.exponential_race import (
    exponential_gap_rows,
    exponential_leaders,
    exponential_top_k,
    gap_scale,
    upper_error,
)

_U = UNIT_ROUNDOFF
_FIRST_BITS = 53  # rng.random() is k·2⁻⁵³ with k a uniform 53-bit integer
_CELL = 2.0**-_FIRST_BITS
_TINY = 2.0**-1060  # covers every float64 underflow in the bounds below
_FLOOR, _CEILING = decimal.ROUND_FLOOR, decimal.ROUND_CEILING

Enclosure = tuple[Decimal, Decimal]


class Utilities(Protocol):
    """The a_i of a race: float64 ``value`` with a_i ≤ value_i + err for every i;
    ``lower(i)`` a rigorous lower bound of a_i (a float); ``exact(idx, prec)`` decimal enclosures
    (lo, hi) of a_idx whose width → 0 as prec → ∞ (about prec significant digits)."""

    @property
    def n(self) -> int: ...  # the number of candidates

    @property
    def value(self) -> npt.NDArray[np.float64]: ...

    @property
    def err(self) -> float: ...

    def lower(self, i: int) -> float: ...

    def exact(self, idx: Sequence[int], prec: int) -> list[Enclosure]: ...


class Noise(Protocol):
    """A noise law by its inverse CDF F⁻¹ (monotone) on the cells [x, x + 2⁻⁵³) of U's first
    53 bits, and on decimal intervals for the slow path."""

    @property
    def error(self) -> float: ...  # |sup(x), sup_at(x) − sup of F⁻¹ on the cell|, |inf_at(x) − inf| ≤ error

    @property
    def magnitude(self) -> float: ...  # |sup of F⁻¹ on the cell| ≤ magnitude wherever it is finite

    def sup(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...

    def sup_at(self, x: float) -> float: ...

    def inf_at(self, x: float) -> float: ...

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

    def inf_at(self, x: float) -> float:
        return -math.log(x + _CELL)  # x + 2⁻⁵³ is exact: x = k·2⁻⁵³ with k < 2⁵³

    def sup_at(self, x: float) -> float:
        return -math.log(x) if x > 0 else math.inf

    def enclose(self, lo: Decimal, hi: Decimal, prec: int) -> Enclosure:
        ctx = decimal_context(prec)
        top = Decimal("Infinity") if lo == 0 else ctx.minus(ctx.ln(lo))
        bottom = ctx.minus(ctx.ln(hi)) if hi < 1 else Decimal(0)
        return widen(bottom, prec)[0], widen(top, prec)[1]


EXPONENTIAL = ExponentialNoise()


class GapUtilities:
    """a_i = (q_i − max q)·ε/(m·Δmax) ≤ 0 on the real numbers the floats denote (rnm: m = 2).

    ``value`` = (q − max q)·c with c = ε/(m·Δmax) shrunk by 16u, so it is an upper bound of the
    real a_i (all ≤ 0: five roundings, each ≤ u, cannot undo 16u) up to underflow; ``lower``
    grows it back by 40u. ``value`` is built on first use: the exponential race fuses it."""

    __slots__ = ("_value", "c", "d_max", "epsilon", "err", "m", "n", "q", "top")

    def __init__(self, q: np.ndarray, epsilon: float, d_max: float, m: int = 2) -> None:
        self.q, self.epsilon, self.d_max, self.m, self.n = q, epsilon, d_max, m, q.shape[0]
        self.top = top = float(q.max())
        self.c, self.err = gap_scale(epsilon, m, d_max, top - float(q.min()))
        self._value: npt.NDArray[np.float64] | None = None

    @property
    def value(self) -> npt.NDArray[np.float64]:
        if self._value is None:
            self._value = (self.q - self.top) * self.c
        return self._value

    def lower(self, i: int) -> float:
        return (float(self.q[i]) - self.top) * self.c * (1.0 + 40.0 * _U) - self.err

    def exact(self, idx: Sequence[int], prec: int) -> list[Enclosure]:
        ctx = decimal_context(prec)
        scale = ctx.divide(Decimal(self.epsilon), ctx.multiply(self.m, Decimal(self.d_max)))
        t = Decimal(self.top)
        return [widen(ctx.multiply(ctx.subtract(Decimal(float(self.q[i])), t), scale), prec) for i in idx]


@numba.njit(cache=True, nogil=True)
def _ratio_leaders(
    g: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """Per row of x: the first argmin of r_i = x_i·g_i, its x_i and the runner-up's r; a row
    with some x_i = 0 gets the runner-up −1 (undecided: 0·inf has no order)."""
    rows, n = x.shape
    top = np.zeros(rows, np.int64)
    x_top = np.zeros(rows)
    second = np.zeros(rows)
    for r in range(rows):
        best, b_r, s_r = 0, math.inf, math.inf
        for i in range(n):
            xi = x[r, i]
            if xi == 0.0:
                s_r = -1.0
                break
            v = xi * g[i]
            if v < b_r:
                best, b_r, s_r = i, v, b_r
            elif v < s_r:
                s_r = v
        top[r], x_top[r], second[r] = best, x[r, best], s_r
    return top, x_top, second


def _upper_error(a: Utilities, noise: Noise, b_max: float) -> float:
    """E with v_j ≤ v̂_j + 1.01u·|v̂_j| + E for v̂ = fl(value + fl(b·sup)) (module docstring)."""
    return upper_error(a.err, noise.error, noise.magnitude, b_max)


def _upper(v: float, e_up: float) -> float:
    """The rigorous upper bound of v_j from its float v̂_j (see :func:`_upper_error`)."""
    return v if v == -math.inf else v + 1.01 * _U * abs(v) + e_up


def _lower(a: Utilities, noise: Noise, scale: np.ndarray | None, i: int, x: float) -> float:
    """A rigorous lower bound of v_i = a_i + b_i·F⁻¹(U_i) for U_i in the cell at x:
    (lower a_i) + b_i·(inf − error), less 3u of the magnitudes for its 3 roundings."""
    z = noise.inf_at(x)
    if not math.isfinite(z):
        return -math.inf
    la = a.lower(i)
    b = 1.0 if scale is None else float(scale[i])
    return la + b * (z - noise.error) - 3.0 * _U * (abs(la) + b * (abs(z) + noise.error)) - _TINY


def race_argmax(
    a: Utilities, noise: Noise, rng: np.random.Generator, size: int, scale: np.ndarray | None = None
) -> npt.NDArray[np.intp]:
    """``size`` independent draws of argmax_i (a_i + b_i·F⁻¹(U_i)), exactly (module docstring)."""
    n = a.n
    if n == 1:
        return np.zeros(size, dtype=np.intp)
    compiled = getattr(noise, "gap_race", None)
    if compiled is not None and isinstance(a, GapUtilities):
        x = rng.random(n)[None, :] if size == 1 else rng.random((size, n))
        return _compiled_rows(a, noise, scale, np.ascontiguousarray(x, dtype=np.float64), rng, compiled)
    if size == 1:
        return np.array([_argmax_row(a, noise, scale, rng.random(n), rng)], dtype=np.intp)
    if noise is EXPONENTIAL and scale is None:
        return exponential_rows(a, rng.random((size, n)), rng)
    return _rows(a, noise, scale, rng.random((size, n)), rng)


def _compiled_rows(
    a: GapUtilities,
    noise: Noise,
    scale: np.ndarray | None,
    x: npt.NDArray[np.float64],
    rng: np.random.Generator,
    compiled: Callable[[GapUtilities, np.ndarray | None, npt.NDArray[np.float64], float], npt.NDArray[np.int64]],
) -> npt.NDArray[np.intp]:
    """A noise's compiled float check (``gap_race``: each row's leader, or −1 − leader where its
    bounds do not decide) on every row of cells x; an undecided row goes through :func:`_rows`
    alone with its own cells, so the output is the same function of the words as :func:`_rows`'."""
    e_up = _upper_error(a, noise, 1.0 if scale is None else float(scale.max()))
    lead = compiled(a, scale, x, e_up)
    if lead.shape[0] == 1 and lead[0] >= 0:  # one selection, decided: the service's case
        return lead.astype(np.intp)
    for r in np.flatnonzero(lead < 0):
        lead[r] = _rows(a, noise, scale, x[r : r + 1], rng)[0]
    return lead.astype(np.intp)


def _rows(
    a: Utilities, noise: Noise, scale: np.ndarray | None, x: npt.NDArray[np.float64], rng: np.random.Generator
) -> npt.NDArray[np.intp]:
    """:func:`_argmax_row` for every row of cells x at once: the float values and each row's
    leader and runner-up in whole-matrix passes, then each row's O(1) bound check; a row the float
    bounds do not decide goes to the decimal slow path with its own cells, as alone."""
    e_up = _upper_error(a, noise, 1.0 if scale is None else float(scale.max()))
    z = noise.sup(x)
    v = a.value + (z if scale is None else scale * z)
    rows = np.arange(x.shape[0])
    top = v.argmax(axis=1)
    v_top = v[rows, top].copy()
    v[rows, top] = -np.inf
    second = v.max(axis=1)
    v[rows, top] = v_top
    out = np.empty(x.shape[0], dtype=np.intp)
    for r in range(x.shape[0]):
        t = int(top[r])
        lead = _lower(a, noise, scale, t, float(x[r, t]))
        if lead > _upper(float(second[r]), e_up):
            out[r] = t
        else:
            out[r] = _slow_row(a, noise, scale, x[r], v[r], lead, e_up, rng, 1, True)[0]
    return out


def _argmax_row(
    a: Utilities, noise: Noise, scale: np.ndarray | None, x: npt.NDArray[np.float64], rng: np.random.Generator
) -> int:
    """The argmax for one row of cells x: the float leader if its lower bound clears every other
    candidate's upper bound, else the decimal slow path. The exponential race is one compiled
    pass (the service's case: few calls per selection); any other race is :func:`_rows` on one row."""
    if noise is not EXPONENTIAL or scale is not None:
        return int(_rows(a, noise, scale, x[None, :], rng)[0])
    e_up = _upper_error(a, noise, 1.0)
    bits = x.view(np.uint64)
    if isinstance(a, GapUtilities):  # the leader and its check in one call: the service's case
        idx, ok = exponential_top_k(a.q, a.top, a.c, a.err, noise.error, e_up, x, bits, 1, True)
        if ok:
            return int(idx[0])
        q, shift, c = a.q, a.top, a.c
    else:
        q, shift, c = a.value, 0.0, 1.0
    top, _, second = exponential_leaders(q, shift, c, x, bits)
    lead = _lower(a, noise, None, top, float(x[top]))
    if lead > _upper(second, e_up):
        return int(top)
    return _slow_row(a, noise, None, x, a.value + noise.sup(x), lead, e_up, rng, 1, True)[0]


def exponential_slow_argmax(
    a: Utilities, x: npt.NDArray[np.float64], v: npt.NDArray[np.float64], lead: float, rng: np.random.Generator
) -> int:
    """The exponential race's argmax on cells x decided in decimal, for a caller whose float
    bounds did not decide it: v the float values (−1.7e308: certainly behind), ``lead`` a rigorous
    lower bound of the float leader's value."""
    return _slow_row(a, EXPONENTIAL, None, x, v, lead, _upper_error(a, EXPONENTIAL, 1.0), rng, 1, True)[0]


def gap_race_rows(
    q: np.ndarray, d: np.ndarray, lengths: np.ndarray, epsilons: np.ndarray, m: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """One exponential race per row of a ragged batch: row b's entry has the law of
    ``race_argmax(GapUtilities(q_b, ε_b, max Δ_b, m), EXPONENTIAL, rng, 1)``, rows independent.
    The cells of all rows of two or more candidates are drawn first, in row order (one
    ``rng.random`` call: the words B such calls would take, in their order), and decided in one
    compiled pass; a row its float bounds leave undecided then goes the usual way on its own
    cells, drawing its further words after them."""
    x = rng.random(int(lengths[lengths > 1].sum()))
    idx, ok = exponential_gap_rows(
        q, d, lengths, epsilons, float(m), EXPONENTIAL.error, EXPONENTIAL.magnitude, x, x.view(np.uint64)
    )
    if not ok.all():
        ends = np.cumsum(lengths)
        cells = np.cumsum(np.where(lengths > 1, lengths, 0))
        for b in np.flatnonzero(~ok).tolist():
            n, s, c = int(lengths[b]), int(ends[b] - lengths[b]), int(cells[b] - lengths[b])
            a = GapUtilities(q[s : s + n], float(epsilons[b]), float(d[s : s + n].max()), m)
            idx[b] = _argmax_row(a, EXPONENTIAL, None, x[c : c + n], rng)
    return idx


def exponential_rows(a: Utilities, x: npt.NDArray[np.float64], rng: np.random.Generator) -> npt.NDArray[np.intp]:
    """The exponential race on each row of cells x (C-contiguous, n ≥ 2), as ratios: argmax
    (a_i − ln U_i) = argmin U_i·G_i, G_i = e^{−a_i} computed once, so a draw costs one product per
    candidate. ĝ = exp(−value) is within a factor (1 ± ρ) of G, ρ = 8.01u + 40.1u·min(max
    |value|, 746) + 2·err (exp's 4 ulps, ``lower``'s 40u); an entry whose ĝ overflows has
    G > e^709 and cannot lead while x > 0. Undecided rows (ρ-close, or a cell at 0) go through
    :func:`_argmax_row` on their own cells, in row order (drawing more words from ``rng``)."""
    with np.errstate(over="ignore"):
        g = np.exp(-a.value)
    rho = 8.01 * _U + 40.1 * _U * min(float(-a.value.min()), 746.0) + 2.0 * a.err
    top, x_top, second = _ratio_leaders(g, x)
    hi = (x_top + _CELL) * g[top] * ((1.0 + rho) * (1.0 + 4.0 * _U))
    decided = (hi < second * (1.0 - rho - 4.0 * _U)) & (hi < 1e290)
    for i in np.flatnonzero(~decided):
        top[i] = _argmax_row(a, EXPONENTIAL, None, x[i], rng)
    return top.astype(np.intp)


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
    n = a.n
    x = rng.random(n)
    k = min(k, n)
    if noise is EXPONENTIAL and scale is None and isinstance(a, GapUtilities) and k < n:
        e_up = _upper_error(a, noise, 1.0)
        idx, ok = exponential_top_k(a.q, a.top, a.c, a.err, noise.error, e_up, x, x.view(np.uint64), k, ordered)
        if ok:  # the float bounds decide; else the same cells go the general way below
            return idx if ordered else np.sort(idx)
    z = noise.sup(x)
    v = a.value + (z if scale is None else scale * z)
    e_up = _upper_error(a, noise, 1.0 if scale is None else float(scale.max()))
    if k == n:
        lead_idx: npt.NDArray[np.intp] = np.argsort(-v, kind="stable")
        rest = -math.inf
    else:
        part = np.argpartition(-v, k)
        lead_idx = part[:k][np.argsort(-v[part[:k]], kind="stable")]
        rest = float(v[part[k]])
    lo = [_lower(a, noise, scale, int(i), float(x[i])) for i in lead_idx]
    hi = [_upper(float(v[i]), e_up) for i in lead_idx]
    rest_hi = _upper(rest, e_up)
    # ordered: each leader certainly ahead of the next; a set: the k-th ahead of the rest
    ok = all(lo[r] > hi[r + 1] for r in range(k - 1)) and lo[-1] > rest_hi if ordered else min(lo) > rest_hi
    if not ok:
        lead_idx = np.asarray(_slow_row(a, noise, scale, x, v, min(lo), e_up, rng, k, ordered), dtype=np.intp)
    return lead_idx if ordered else np.sort(lead_idx)


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
    cell = Decimal(2**bits)  # exact (an int); Decimal(2) ** bits would round to the default 28 digits
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
