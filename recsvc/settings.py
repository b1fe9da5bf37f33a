"""Settings declared once: a config dataclass's field carries its default, its constraint, its
unit and its help (:func:`setting`), and from it come the command-line flag (:func:`add_arguments`,
its default shown by ``--help``), the validation with the project's clear error
(:func:`check` → :class:`~recsvc.checks.ParamError` naming the parameter, which the command line
shows as its flag), the config itself (:func:`from_namespace`) and the generated CLI reference
(docs/reference/cli.md, rendered from the parsers).

The model is scikit-learn's ``_parameter_constraints``: constraints are data, checked in one
place. The mechanisms' :class:`~recsvc.mechanisms.params.ParamSpec` is the same idea for real
parameters: its ranges are :class:`Range` values and it builds its :class:`Setting` from itself
(``ParamSpec.setting``), whose flag :func:`add_setting` adds.

A config class may nest groups: a field whose default factory is another settings dataclass
contributes that group's settings, under their own flat names (``ServerConfig.listen.port`` is
``--port``). Stdlib only, so ``recsvc --help`` stays instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from recsvc.checks import ParamError

__all__ = [
    "Each",
    "OneOf",
    "Range",
    "Setting",
    "add_arguments",
    "add_setting",
    "check",
    "flag",
    "from_namespace",
    "setting",
    "settings_of",
    "typed",
]


def typed(value: object) -> str:
    """A value as a user types it: a sequence's items separated by spaces, a whole float without
    its ``.0`` (86400, 0.25, 1e-06, ``0.1 1 3``); the one rendering of ``--help``'s defaults, the
    errors' values and the reports' settings."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(typed, value))
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Range:
    """A number's constraint: ``low``/``high`` (None: unbounded), each inclusive unless its
    ``*_open`` flag is set; ``integer`` also requires an integer, ``finite`` (the default) a
    finite number. ``none`` accepts None as well (an optional setting)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    finite: bool = True
    none: bool = False

    def holds(self, value: object) -> bool:
        if value is None:
            return self.none
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        v = float(value)
        if math.isnan(v) or (self.finite and not math.isfinite(v)):
            return False
        if self.low is not None and not (v > self.low if self.low_open else v >= self.low):
            return False
        return self.high is None or (v < self.high if self.high_open else v <= self.high)

    @property
    def interval(self) -> str:
        """The interval in bracket notation, e.g. ``(0, 1]``, ``[1e-06, 1)``, ``[1, ∞)``."""
        lo = "(-∞" if self.low is None else f"{'(' if self.low_open else '['}{typed(self.low)}"
        hi = "∞)" if self.high is None else f"{typed(self.high)}{')' if self.high_open else ']'}"
        return f"{lo}, {hi}"

    def describe(self) -> str:
        """What is expected, e.g. ``an integer ≥ 1``, ``a number in (0, 1]``, ``a finite number > 0``."""
        kind = "an integer" if self.integer else ("a finite number" if self.finite else "a number")
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            text = f"{kind} in {self.interval}"
        elif lo is not None:
            text = f"{kind} {'>' if self.low_open else '≥'} {typed(lo)}"
        elif hi is not None:
            text = f"{kind} {'<' if self.high_open else '≤'} {typed(hi)}"
        else:
            text = kind
        return text  # no "(or none)": a flag left out is the none, and a user cannot type one


@dataclass(frozen=True)
class OneOf:
    """A value among ``choices`` (argparse checks them on the command line; :func:`check` in code);
    ``none`` accepts None as well (an optional setting, not one of the flag's choices)."""

    choices: tuple[Any, ...]
    none: bool = False

    def holds(self, value: object) -> bool:
        return self.none if value is None else value in self.choices

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.choices))


@dataclass(frozen=True)
class Each:
    """A list whose every item meets ``item`` (and that has at least ``least`` items); ``none``
    accepts None as well (an optional setting)."""

    item: Range | OneOf
    least: int = 1
    none: bool = False

    def holds(self, value: object) -> bool:
        if value is None:
            return self.none
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            return False
        return len(value) >= self.least and all(self.item.holds(v) for v in value)

    def describe(self) -> str:
        count = "one or more values" if self.least == 1 else f"{self.least} or more values"
        return f"{count}, each {self.item.describe()}"


Constraint = Range | OneOf | Each
FIELD_DEFAULT = "<the field's>"  # a flag's default that is its field's


@dataclass(frozen=True)
class Setting:
    """How one config field reads on the command line and is checked. ``type`` converts a
    command-line word (default: the type of the field's default); ``unit`` names the flag's
    value (``--receive-timeout SECONDS``) and ``help`` says what the setting does, in one line."""

    help: str
    unit: str = ""
    check: Constraint | None = None
    type: Callable[[str], Any] | None = None
    nargs: str | int | None = None
    aliases: tuple[str, ...] = ()
    required: bool = False
    name: str = ""  # the flat parameter name, when it is not the field's own (``ledger_pool``)
    repeat: bool = False  # the flag may be given again, each time adding one value (argparse's append)
    # The flag's default when it is not the field's: None (not given) keeps the field's default,
    # for one that depends on other settings or is too long to show (the help states it).
    flag_default: Any = FIELD_DEFAULT

    def __post_init__(self) -> None:
        if not self.help or "\n" in self.help:
            raise ValueError("a setting's help must be one non-empty line")


def setting(
    default: Any = MISSING,
    *,
    help: str,
    unit: str = "",
    check: Constraint | None = None,
    type: Callable[[str], Any] | None = None,
    nargs: str | int | None = None,
    aliases: tuple[str, ...] = (),
    name: str = "",
    repeat: bool = False,
    default_factory: Callable[[], Any] | Any = MISSING,
    flag_default: Any = FIELD_DEFAULT,
) -> Any:
    """A dataclass field declared once: its default and its :class:`Setting`."""
    required = default is MISSING and default_factory is MISSING
    meta = {"setting": Setting(help, unit, check, type, nargs, aliases, required, name, repeat, flag_default)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Declared:
    """One setting of a config class: its flat name, the path of fields that holds it, its field."""

    name: str
    path: tuple[str, ...]
    field: dataclasses.Field
    spec: Setting

    @property
    def default(self) -> Any:
        f = self.field
        if f.default is not MISSING:
            return f.default
        if f.default_factory is not MISSING:
            return f.default_factory()
        return None


def _group(f: dataclasses.Field) -> type | None:
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


def settings_of(cls: type, path: tuple[str, ...] = ()) -> Iterator[Declared]:
    """Every setting of ``cls`` and of its nested groups, in declaration order."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is not None:
            yield Declared(spec.name or f.name, (*path, f.name), f, spec)
        elif (group := _group(f)) is not None:
            yield from settings_of(group, (*path, f.name))


def flag(name: str) -> str:
    """The command-line flag of parameter ``name`` (``max_batch`` → ``--max-batch``)."""
    return "--" + name.replace("_", "-")


# A str setting needs no conversion: argparse gives the word itself, as a flag without ``type`` does.
_SIMPLE: dict[str, Callable[[str], Any]] = {"Path": Path, "int": int, "float": float}


def _type_of(d: Declared) -> Callable[[str], Any] | None:
    """The declared ``type``; else the field's annotation when it is one simple type or that type
    or None (``Path | None``); else the default's type."""
    if d.spec.type is not None:
        return d.spec.type
    hint = d.field.type if isinstance(d.field.type, str) else getattr(d.field.type, "__name__", "")
    names = [n.strip() for n in hint.split("|") if n.strip() != "None"]
    if len(names) == 1 and names[0] in _SIMPLE:
        return _SIMPLE[names[0]]
    default = d.default
    if isinstance(default, (list, tuple)):
        default = default[0] if default else None
    if isinstance(default, (bool, str)) or default is None:
        return None
    if isinstance(default, Path):
        return Path
    return type(default)


def add_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
) -> None:
    """A flag for each setting of ``cls`` (or only those named in ``only``, in that order), its
    default the field's: a bool that defaults to False is a switch (``--force``)."""
    declared = {d.name: d for d in settings_of(cls)}
    names = list(declared) if only is None else list(only)
    for name in names:
        if name in skip:
            continue
        add_argument(parser, declared[name])


def add_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, d: Declared) -> None:
    default = d.default if d.spec.flag_default is FIELD_DEFAULT else d.spec.flag_default
    add_setting(parser, d.name, d.spec, default, kind=_type_of(d))


def add_setting(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    spec: Setting,
    default: Any = None,
    *,
    kind: Callable[[str], Any] | None = None,
) -> argparse.Action:
    """The flag of setting ``name``, declared by ``spec``, whose value defaults to ``default``;
    ``kind`` converts its word (default: ``spec.type``). :func:`add_arguments` reads these from a
    config class; a setting declared elsewhere (a mechanism's parameter) passes them itself. A
    short alias (``-v``) comes first, as ``--help`` conventionally lists it."""
    short = [a for a in spec.aliases if not a.startswith("--")]
    options = [*short, flag(name), *(a for a in spec.aliases if a not in short)]
    if default is False and spec.type is None:
        return parser.add_argument(*options, dest=name, action="store_true", help=spec.help)
    kwargs: dict[str, Any] = {"dest": name, "default": default, "help": spec.help.replace("%", "%%")}
    kind = kind or spec.type
    if kind is not None:
        kwargs["type"] = kind
    if isinstance(spec.check, OneOf) and spec.nargs is None:
        kwargs["choices"] = spec.check.choices
    elif isinstance(spec.check, Each) and isinstance(spec.check.item, OneOf):
        kwargs["choices"] = spec.check.item.choices
    if spec.nargs is not None:
        kwargs["nargs"] = spec.nargs
    if spec.repeat:
        kwargs["action"] = "append"
    if spec.unit:
        kwargs["metavar"] = spec.unit.upper().replace(" ", "_")
    if spec.required:
        kwargs["required"] = True
        kwargs.pop("default")
    return parser.add_argument(*options, **kwargs)


def check(config: object) -> None:
    """Raises a ParamError for the first setting of ``config`` (and its groups) whose value breaks
    its constraint: ``{name} must be <what the constraint expects>, got <value>``."""
    for d in settings_of(type(config)):
        if d.spec.check is None:
            continue
        value: Any = config
        for attr in d.path:
            value = getattr(value, attr)
        if not d.spec.check.holds(value):
            got = repr(value) if isinstance(value, str) else typed(value) or "no values"
            raise ParamError(
                f"{{{d.name}}} must be {{expected}}, got {{got}}", expected=d.spec.check.describe(), got=got
            )


def from_namespace(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """``cls`` (and its nested groups) from the parsed flags that name its settings, then
    ``values`` (other fields, by name), checked by :func:`check`."""
    return _build(cls, (), vars(args), values)


def _build(cls: type, path: tuple[str, ...], parsed: dict[str, Any], values: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is not None:
            name = spec.name or f.name
            if name in values:
                kwargs[f.name] = values[name]
            elif name in parsed and not (parsed[name] is None and spec.flag_default is None):
                value = parsed[name]  # a flag's list of values is a tuple in the (frozen) config
                kwargs[f.name] = tuple(value) if isinstance(value, list) else value
        elif (group := _group(f)) is not None:
            kwargs[f.name] = _build(group, (*path, f.name), parsed, values)
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    config = cls(**kwargs)
    if not path:
        check(config)
    return config
