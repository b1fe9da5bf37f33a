"""Mechanism parameters, each declared once as a :class:`ParamSpec` (docs/reference/specification.md §2).

A registry entry maps each parameter it takes to its spec; validation, defaults, command-line
flags, the ``recsvc mechanisms`` listing and docs/concepts/mechanisms.md are all derived from the specs.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from recsvc.mechanisms.validation import MechanismParamError
from recsvc.settings import Range, Setting

# What a sampler receives: its own parameters, each given or defaulted, already checked.
ParamValues = Mapping[str, float]


@dataclass(frozen=True)
class ParamSpec:
    """One real mechanism parameter: ``low``/``high`` bound its mathematical range (each open
    unless its ``*_inclusive`` flag is set); ``floor`` is an optional practical minimum inside
    that range (inclusive), refused below with ``floor_reason``. The ranges are
    :class:`recsvc.settings.Range` values (:attr:`range`, :attr:`accepted_range`) and the flag a
    :class:`recsvc.settings.Setting` (:attr:`setting`), the vocabulary of every other setting."""

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
    def range(self) -> Range:
        """The mathematical range as a :class:`~recsvc.settings.Range`; ``finite=False``: the
        bounds alone decide, as they always have."""
        return Range(
            self.low, self.high, low_open=not self.low_inclusive, high_open=not self.high_inclusive, finite=False
        )

    @property
    def accepted_range(self) -> Range:
        """The accepted range: :attr:`range` raised to ``floor`` (inclusive)."""
        if self.floor is None:
            return self.range
        return dataclasses.replace(self.range, low=self.floor, low_open=False)

    @property
    def domain(self) -> str:
        """The mathematical range, e.g. ``(0, 1)`` or ``(0, 1]``."""
        return self.range.interval

    @property
    def accepted(self) -> str:
        """The accepted range (``domain`` raised to ``floor``), e.g. ``[1e-06, 1)``."""
        return self.accepted_range.interval

    @property
    def summary(self) -> str:
        """``name=default in range``, e.g. ``gamma=0.008 in [1e-06, 1)``."""
        return f"{self.name}={self.default:g} in {self.accepted}"

    @property
    def setting(self) -> Setting:
        """The parameter as a command-line setting: ``--gamma GAMMA``, a float in :attr:`accepted_range`
        or none (unset: the mechanism's own default, which :meth:`check` then reads)."""
        return Setting(
            self.doc,
            unit=self.name,
            check=dataclasses.replace(self.accepted_range, none=True),
            type=float,
            name=self.name,
        )

    def check(self, value: object) -> float:
        """``value`` as a float if it is a real number in the accepted range; else
        :class:`MechanismParamError` naming the parameter and the range."""
        name = f"{{{self.name}}}"  # a parameter field: the command line shows its flag
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise MechanismParamError(
                name + " must be a real number in {_range}, got {_got}", _range=self.domain, _got=repr(value)
            )
        v = float(value)
        if not self.range.holds(v):  # NaN included
            kind = {(False, False): "the open interval", (True, True): "the closed interval"}.get(
                (self.low_inclusive, self.high_inclusive), "the interval"
            )
            raise MechanismParamError(
                name + " must be in {_kind} {_range}, got {_got}", _kind=kind, _range=self.domain, _got=repr(v)
            )
        if not self.accepted_range.holds(v):
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
