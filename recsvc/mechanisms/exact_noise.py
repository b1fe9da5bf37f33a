"""Laplace noise for the exact races of :mod:`recsvc.mechanisms.exact_race` (``rnm_laplace``,
``rs``, ``rs_improved``).

L = F⁻¹(U) with F⁻¹(u) = ln(2u) for u ≤ ½ and −ln(2(1 − u)) above: increasing, so the sup over a
cell [x, x + c) of U's first 53 bits (c = 2⁻⁵³) is F⁻¹(x + c). The cells never straddle ½ (a
multiple of c), and 2y, 1 − y (y ≥ ½) are exact in float64, so the float sup and inf are one
``log`` each (within 4 ulps of |ln| ≤ 36.1; the inf is −inf at x = 0, the sup +inf at x + c = 1).
The decimal enclosure rounds each argument in the direction that keeps the bound (F⁻¹ is
increasing), then widens by ln's own rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_race import Enclosure, widen
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF, decimal_context

_CELL = 2.0**-53
_HALF = Decimal("0.5")


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

    def enclose(self, lo: Decimal, hi: Decimal, prec: int) -> Enclosure:
        bottom = _laplace_quantile(lo, prec, down=True)
        top = _laplace_quantile(hi, prec, down=False)
        return widen(bottom, prec)[0], widen(top, prec)[1]


LAPLACE = LaplaceNoise()
