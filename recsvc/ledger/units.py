"""Exact ε accounting: the ledger counts ε in integer units of 10⁻¹² (one "pico-ε").

Floats cannot keep a running total: after spending 8.0, ``8.0 + 4e-16 == 8.0``, so tiny charges
would vanish. The ledger therefore stores integers (SQLite INTEGER, at most 2⁶³ − 1 units,
i.e. ε ≤ 9,223,372.036854775807) and compares them exactly.

* **A charge is rounded UP** to the unit: ``units = ⌈ε · 10¹²⌉``, where ε is the decimal the
  client wrote, i.e. the shortest decimal that round-trips to the double it sent (Python's
  ``repr``: ``0.1`` is 0.1, so 100 requests of ε = 0.1 spend exactly 10). The double's own
  representation error (< 1.2·10⁻¹⁶ relative) is below the precision with which any mechanism
  computes with ε at all. Any ε with at most 12 digits after the decimal point is charged exactly.
* **An ε below the unit (< 10⁻¹²) is refused**, and so is one whose charge does not fit 63 bits:
  :class:`InvalidCharge` (a ``ValueError``: INVALID_ARGUMENT), raised before the ledger is touched.
* **The budget is rounded DOWN** to the unit (it only ever shrinks).
* A ledger written with float totals is migrated by rounding each stored value UP from its exact
  binary value (see :mod:`recsvc.ledger.sqlite.schema`).

Stdlib only: the service's configuration checks the budget with it.
"""

from __future__ import annotations

import functools
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from fractions import Fraction
from typing import ClassVar

from recsvc.checks import check_epsilon

UNITS_PER_EPSILON = 10**12
UNIT_EXPONENT = -12  # one unit is 1e-12 ε
MAX_UNITS = 2**63 - 1  # SQLite's INTEGER


class InvalidCharge(ValueError):
    """An ε the ledger cannot count exactly (below the unit, or beyond 63 bits): nothing spent."""

    status: ClassVar[str] = "INVALID_ARGUMENT"


def _decimal(value: float) -> Decimal | None:
    """The shortest decimal that round-trips to ``value``; None for NaN, ±inf and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return Decimal(repr(float(value)))


def format_units(units: int) -> str:
    """Exact decimal ε of ``units``, e.g. ``100000000001`` → ``'0.100000000001'``, ``10**13`` → ``'10'``."""
    return format(Decimal(units).scaleb(UNIT_EXPONENT).normalize(), "f")


MAX_EPSILON = format_units(MAX_UNITS)


def charge_units(epsilon: float) -> int:
    """The units a charge of ``epsilon`` spends: ⌈ε · 10¹²⌉ of the decimal ε (see the module doc)."""
    if type(epsilon) is float:  # the wire's doubles: a service sees few distinct ε, each converted once
        return _float_charge_units(epsilon)
    return _charge_units(epsilon)


def _charge_units(epsilon: float) -> int:
    check_epsilon(epsilon, error=InvalidCharge)
    d = _decimal(epsilon)
    if d is None:  # a real number the ledger does not read exactly (numpy float32, Fraction, …)
        raise InvalidCharge(f"epsilon must be a Python int or float, got {type(epsilon).__name__} {epsilon!r}")
    units = int(d.scaleb(-UNIT_EXPONENT).to_integral_value(rounding=ROUND_CEILING))
    if d.scaleb(-UNIT_EXPONENT) < 1:
        raise InvalidCharge(
            f"epsilon={epsilon!r} is below the ledger's unit 1e-12, so it cannot be counted; expected epsilon >= 1e-12"
        )
    if units > MAX_UNITS:
        raise InvalidCharge(
            f"epsilon={epsilon!r} is too large for the ledger to count; expected epsilon <= {MAX_EPSILON}"
        )
    return units


_float_charge_units = functools.lru_cache(maxsize=4096)(_charge_units)  # a refusal raises, never cached


def budget_units(budget: float) -> int | None:
    """``budget`` in units, rounded DOWN; None if it is not a finite ε in [1e-12, MAX_EPSILON]."""
    d = _decimal(budget)
    if d is None:
        return None
    units = int(d.scaleb(-UNIT_EXPONENT).to_integral_value(rounding=ROUND_FLOOR))
    return units if 1 <= units <= MAX_UNITS else None


def float_units_up(value: float) -> int:
    """A stored float total in units, rounded UP from its exact binary value (migration only:
    the float may already be a rounded sum, so no decimal reading is assumed)."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a stored ε must be finite and >= 0, got {value!r}")
    return math.ceil(Fraction(value) * UNITS_PER_EPSILON)


def to_epsilon(units: int) -> float:
    """``units`` as the nearest double, for responses and metrics (never for comparisons)."""
    return units / UNITS_PER_EPSILON
