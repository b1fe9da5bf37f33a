"""Laplace noise for the exact races of :mod:`recsvc.mechanisms.exact_race` (``rnm_laplace``,
``rs``, ``rs_improved``).

L = F⁻¹(U) with F⁻¹(u) = ln(2u) for u ≤ ½ and −ln(2(1 − u)) above: increasing, so the sup over a
cell [x, x + c) of U's first 53 bits (c = 2⁻⁵³) is F⁻¹(x + c). The cells never straddle ½ (a
multiple of c), and 2y, 1 − y (y ≥ ½) are exact in float64, so the float sup and inf are one
``log`` each (within 4 ulps of |ln| ≤ 36.1; the inf is −inf at x = 0, the sup +inf at x + c = 1).
The decimal enclosure rounds each argument in the direction that keeps the bound (F⁻¹ is
increasing), then widens by ln's own rounding.

**Compiled rows** (:meth:`LaplaceNoise.gap_race`, ``rnm_laplace``'s case: the race's
:class:`~recsvc.mechanisms.exact_race.GapUtilities`, a_j ≤ 0). Without scales the race is run on
W_j = e^{v_j} = g_j·h(U_j), g_j = e^{a_j}, h(y) = e^{F⁻¹(y)} = 2y up to ½ and 1/(2(1 − y)) above
(increasing, so the argmax is the same): ĝ_j = exp(max(value_j, −600)) once per call (libm's
``exp``, within 4 ulps as numpy's), then one product a cell and at most one division, no ``log``.
ĝ bounds g_j within a factor (1 ± ρ), ρ = 8.01u + 40.1u·min(max |value|, 600) + 3·err (exp's
4 ulps; ``lower``'s 40u; e^{err} ≤ 1 + 2err): from above for every j (a value below −600 has
g_j < e^{−600+err}), from both sides where value_j ≥ −600. h at a cell's ends is exact up to ½
and within u above (1 − y and 2(1 − y) are exact), so ŵ_j = fl(ĝ_j·h(x_j + 2⁻⁵³)) ≥
W_j/((1 + ρ)(1 + 2.01u)) over the cell and the leader's fl(ĝ_t·h(x_t)) ≤ W_t·(1 + 2.01u)/(1 − ρ):
its lower bound fl(fl(ĝ_t·h(x_t))·fl(1 − ρ − 8u)) and the runner-up's upper bound
fl(ŵ·fl(1 + ρ + 8u)) leave ≥ 3u for their own roundings. Every factor is ≥ e^{−600}·2⁻⁵² (normal)
and ≤ 2⁵², or +∞ (the top cell's sup: a runner-up there leaves its row undecided); h(0) = 0 and a
leader whose value is below −600 leave it undecided too. With scales b_j (random stopping's
undecided trials) the kernel computes the race's own float values
v̂_j = fl(fl(fl(q_j − max q)·c) + fl(b_j·sup_j)) and bounds, the same expressions as the race's
Python check (``_lower``, ``_upper``), one ``log`` a cell. A row the compiled check does not decide
(about one in 10¹⁰, or a NaN value) goes back to the race with its own cells, which decides it
exactly: the output is the same function of the random words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_race import Enclosure, GapUtilities, widen
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF, decimal_context

_CELL = 2.0**-53
_HALF = Decimal("0.5")
_TINY = 2.0**-1060  # the race's underflow allowance (exact_race._TINY)
_FLOOR = -600.0  # ĝ = exp(max(value, −600)): normal, and its products with h(·) too


def _signed_log(y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """F⁻¹(y) in float64 for y in [0, 1]: ln 2y below ½, −ln 2(1 − y) above (both arguments
    exact), one ``log`` pass; ln 0 = −inf at y = 0, +inf at y = 1."""
    low = y <= 0.5
    arg = np.where(low, 2.0 * y, 2.0 * (1.0 - y))
    with np.errstate(divide="ignore"):
        out: npt.NDArray[np.float64] = np.log(arg)
    np.negative(out, out=out, where=~low)
    return out


def _laplace_quantile(u: Decimal, prec: int, down: bool) -> Decimal:
    """A bound of F⁻¹(u) (a lower one if ``down``) from correctly rounded decimal operations;
    ln's own rounding is left to :func:`widen`."""
    toward, away = (ROUND_FLOOR, ROUND_CEILING) if down else (ROUND_CEILING, ROUND_FLOOR)
    ctx = decimal_context(prec)
    if u <= _HALF:
        if u <= 0:
            return Decimal("-Infinity")
        return ctx.ln(decimal_context(prec, toward).multiply(2, u))
    rest = decimal_context(prec, away).subtract(1, u)
    if rest <= 0:
        return Decimal("Infinity")
    return ctx.minus(ctx.ln(decimal_context(prec, away).multiply(2, rest)))


@numba.njit(cache=True, nogil=True)
def _quantile(y: float) -> float:  # pragma: no cover - numba
    """F⁻¹(y) as :func:`_signed_log` computes it, for one y in [0, 1]."""
    if y <= 0.5:
        return math.log(2.0 * y) if y > 0.0 else -math.inf
    return -math.log(2.0 * (1.0 - y)) if y < 1.0 else math.inf


@numba.njit(cache=True, nogil=True)
def _ratio_rows(
    q: np.ndarray, top: float, c: float, err: float, x: np.ndarray
) -> np.ndarray:  # pragma: no cover - numba
    """Per row of cells x (rows × n): the first float leader t of ŵ_j = ĝ_j·h(x_j + 2⁻⁵³) if its
    lower bound exceeds the runner-up's upper bound (module docstring), else −1 − t. value_j =
    fl(fl(q_j − top)·c) is GapUtilities' ``value``; ĝ and ρ are computed once, for every row."""
    u = 2.0**-53
    rows, n = x.shape
    value = np.empty(n)
    g = np.empty(n)
    spread = 0.0
    for j in range(n):
        value[j] = (q[j] - top) * c
        g[j] = math.exp(max(value[j], _FLOOR))
        spread = max(spread, -value[j])
    rho = 8.01 * u + 40.1 * u * min(spread, -_FLOOR) + 3.0 * err
    down, up = 1.0 - rho - 8.0 * u, 1.0 + rho + 8.0 * u
    lead = np.empty(rows, dtype=np.int64)
    for r in range(rows):
        best, w_best, second = 0, -1.0, -1.0  # every ŵ ≥ 0: the first candidate leads first
        for j in range(n):
            y = x[r, j] + _CELL  # exact: x is a multiple of 2⁻⁵³ below 1
            h = 2.0 * y if y <= 0.5 else (1.0 / (2.0 * (1.0 - y)) if y < 1.0 else math.inf)
            w = g[j] * h
            if w > second:  # w_best ≥ second: most cells stop here
                if w > w_best:
                    best, w_best, second = j, w, w_best
                else:
                    second = w
        y = x[r, best]
        h = 2.0 * y if y <= 0.5 else 1.0 / (2.0 * (1.0 - y))  # y < 1; h(0) = 0: undecided
        decided = value[best] >= _FLOOR and g[best] * h * down > second * up
        lead[r] = best if decided else -1 - best
    return lead


@numba.njit(cache=True, nogil=True)
def _gap_rows(
    q: np.ndarray, top: float, c: float, err: float, scale: np.ndarray, x: np.ndarray, error: float, e_up: float
) -> np.ndarray:  # pragma: no cover - numba
    """Per row of cells x (rows × n): the first float leader t of v̂_j = fl(fl(q_j − top)·c) +
    fl(b_j·sup_j) if its lower bound exceeds the runner-up's upper bound, else −1 − t (a NaN
    value: −1), b_j = scale[j]. The bounds are the race's (exact_race ``_lower``, ``_upper``) in the
    same operations."""
    u = 2.0**-53
    rows, n = x.shape
    lead = np.empty(rows, dtype=np.int64)
    for r in range(rows):
        best, v_best, second, bad = 0, -math.inf, -math.inf, False
        for j in range(n):
            z = _quantile(x[r, j] + _CELL)  # the cell's sup: x + 2⁻⁵³ is exact
            v = (q[j] - top) * c + scale[j] * z
            if math.isnan(v):
                bad = True
                break
            if v > v_best or j == 0:
                if j > 0:
                    second = max(second, v_best)
                best, v_best = j, v
            elif v > second:
                second = v
        if bad:
            lead[r] = -1
            continue
        hi = second if second == -math.inf else second + 1.01 * u * abs(second) + e_up
        z = _quantile(x[r, best])  # the cell's inf: −inf at x = 0
        if math.isfinite(z):
            la = (q[best] - top) * c * (1.0 + 40.0 * u) - err
            b = scale[best]
            lo = la + b * (z - error) - 3.0 * u * (abs(la) + b * (abs(z) + error)) - _TINY
        else:
            lo = -math.inf
        lead[r] = best if lo > hi else -1 - best
    return lead


@dataclass(frozen=True)
class LaplaceNoise:
    """L ~ Laplace(0, 1) by its inverse CDF (module docstring): the :class:`~recsvc.mechanisms.exact_race.Noise`
    protocol."""

    error: float = 8.0 * UNIT_ROUNDOFF * 37.0  # 4 ulps of |ln| ≤ 36.1
    magnitude: float = 37.0

    def sup(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return _signed_log(x + _CELL)  # exact: x is a multiple of 2⁻⁵³ below 1

    def inf(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """:meth:`inf_at` on an array (x = 0: −inf)."""
        return _signed_log(x)

    def sup_at(self, x: float) -> float:
        y = x + _CELL
        if y <= 0.5:
            return math.log(2.0 * y)
        return -math.log(2.0 * (1.0 - y)) if y < 1.0 else math.inf

    def inf_at(self, x: float) -> float:
        if x <= 0.5:
            return math.log(2.0 * x) if x > 0 else -math.inf
        return -math.log(2.0 * (1.0 - x))  # 1 − x ≥ 2⁻⁵³, exact

    def gap_race(
        self, a: GapUtilities, scale: np.ndarray | None, x: npt.NDArray[np.float64], e_up: float
    ) -> npt.NDArray[np.int64]:
        """The race's float check of every row of cells x in one compiled pass (module
        docstring): each row's leader, or −1 − leader where the bounds do not decide it."""
        out: npt.NDArray[np.int64]
        q = np.ascontiguousarray(a.q, dtype=np.float64)
        if scale is None:
            out = _ratio_rows(q, a.top, a.c, a.err, x)
            return out
        b = np.ascontiguousarray(scale, dtype=np.float64)
        out = _gap_rows(q, a.top, a.c, a.err, b, x, self.error, e_up)
        return out

    def enclose(self, lo: Decimal, hi: Decimal, prec: int) -> Enclosure:
        bottom = _laplace_quantile(lo, prec, down=True)
        top = _laplace_quantile(hi, prec, down=False)
        return widen(bottom, prec)[0], widen(top, prec)[1]


LAPLACE = LaplaceNoise()
