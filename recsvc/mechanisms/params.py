"""Mechanism parameters, each declared once as a :class:`ParamSpec` (docs/reference/specification.md §2).

A registry entry maps each parameter it takes to its spec; validation, defaults, command-line
flags, the ``recsvc mechanisms`` listing and docs/concepts/mechanisms.md are all derived from the specs.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from recsvc.mechanisms.validation import MechanismParamError

# What a sampler receives: its own parameters, each given or defaulted, already checked.
ParamValues = Mapping[str, float]


@dataclass(frozen=True)
class ParamSpec:
    """One real mechanism parameter: ``low``/``high`` bound its mathematical range (each open
    unless its ``*_inclusive`` flag is set); ``floor`` is an optional practical minimum inside
    that range (inclusive), refused below with ``floor_reason``."""

    name: str
    default: float
    low: float
    high: float
    doc: str  # one line, shown by `--help`, `recsvc mechanisms` and docs/concepts/mechanisms.md
    low_inclusive: bool = False
    high_inclusive: bool = False
    floor: float | None = None
    floor_reason: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):  # `_x`: the message's own fields
            raise ValueError(f"parameter name must be a Python identifier not starting with '_', got {self.name!r}")
        if not self.low < self.high:
            raise ValueError(f"{self.name}: low must be < high, got {self.low!r} and {self.high!r}")
        if not self.doc or "\n" in self.doc:
            raise ValueError(f"{self.name}: doc must be one non-empty line")
        if self.floor is not None and not self.low <= self.floor < self.high:
            raise ValueError(f"{self.name}: floor must lie in {self.domain}, got {self.floor!r}")
        try:
            self.check(self.default)
        except MechanismParamError:
            raise ValueError(f"{self.name}: default {self.default!r} is outside {self.accepted}") from None

    @property
    def domain(self) -> str:
        """The mathematical range, e.g. ``(0, 1)`` or ``(0, 1]``."""
        return f"{'[' if self.low_inclusive else '('}{self.low:g}, {self.high:g}{']' if self.high_inclusive else ')'}"

    @property
    def accepted(self) -> str:
        """The accepted range (``domain`` raised to ``floor``), e.g. ``[1e-06, 1)``."""
        if self.floor is None:
            return self.domain
        return f"[{self.floor:g}, {self.high:g}{']' if self.high_inclusive else ')'}"

    @property
    def summary(self) -> str:
        """``name=default in range``, e.g. ``gamma=0.008 in [1e-06, 1)``."""
        return f"{self.name}={self.default:g} in {self.accepted}"

    def check(self, value: object) -> float:
        """``value`` as a float if it is a real number in the accepted range; else
        :class:`MechanismParamError` naming the parameter and the range."""
        name = f"{{{self.name}}}"  # a parameter field: the command line shows its flag
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise MechanismParamError(
                name + " must be a real number in {_range}, got {_got}", _range=self.domain, _got=repr(value)
            )
        v = float(value)
        above = v >= self.low if self.low_inclusive else v > self.low
        below = v <= self.high if self.high_inclusive else v < self.high
        if not (above and below):  # NaN fails both
            kind = {(False, False): "the open interval", (True, True): "the closed interval"}.get(
                (self.low_inclusive, self.high_inclusive), "the interval"
            )
            raise MechanismParamError(
                name + " must be in {_kind} {_range}, got {_got}", _kind=kind, _range=self.domain, _got=repr(v)
            )
        if self.floor is not None and v < self.floor:
            raise MechanismParamError(
                name + " must be at least {_floor} ({_why}), got {_got}",
                _floor=f"{self.floor:g}",
                _why=self.floor_reason,
                _got=repr(v),
            )
        return v


def param_specs(*specs: ParamSpec) -> Mapping[str, ParamSpec]:
    """A registry entry's ``params``: name → spec, read-only, in the given order."""
    out = {s.name: s for s in specs}
    if len(out) != len(specs):
        raise ValueError(f"duplicate parameter names in {[s.name for s in specs]}")
    return MappingProxyType(out)
