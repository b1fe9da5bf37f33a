"""Checks of user-given numbers and paths shared by the parts (pipeline, harness, engines,
service). Messages name the parameter or file, so the one-line error says what to change."""

from __future__ import annotations

import math
import numbers
import string
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar


class ParamError(ValueError):
    """Bad value of a named parameter. The message is a template whose ``{name}`` fields are
    parameter names: ``str()`` shows them as the library's names (``out``), and the command
    line shows its own flags instead (``--out``) with :meth:`render`."""

    status: ClassVar[str] = "INVALID_ARGUMENT"  # the grpc.StatusCode member's name, for the service

    def __init__(self, template: str, **values: object) -> None:
        self.template = template
        self.values = values  # extra fields that are not parameter names (paths, numbers)
        super().__init__(self.render({}))

    @property
    def params(self) -> tuple[str, ...]:
        names = (f for _, f, _, _ in string.Formatter().parse(self.template) if f)
        return tuple(dict.fromkeys(n for n in names if n not in self.values))

    def render(self, names: Mapping[str, str]) -> str:
        """The message with each parameter shown as ``names[param]`` (default: the param itself)."""
        return self.template.format(**{p: names.get(p, p) for p in self.params}, **self.values)


def check_epsilon(value: object, name: str = "epsilon", error: type[Exception] = ValueError) -> float:
    """``value`` as a float if it is a real number, finite and > 0 (a privacy budget ε); else
    ``error`` (a ``ValueError`` type: each part keeps its own, e.g. ``MechanismInputError``) with a
    message naming ``name`` (``epsilon``, ``--epsilon``, ``ε``)."""
    if type(value) is float and 0.0 < value < math.inf:  # the common case, without the ABC checks
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a positive finite real number, got {value!r}")
    e = float(value)
    if not math.isfinite(e) or e <= 0.0:
        raise error(f"{name} must be a positive finite number, got {e!r}")
    return e


def check_int(param: str, value: object, least: int) -> int:
    """``value`` as an int if it is an integer (Python or numpy, not bool) ≥ ``least``; else a
    :class:`ParamError` naming ``param``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ParamError(f"{{{param}}} must be an integer ≥ {{least}}, got {{value}}", least=least, value=repr(value))
    return int(value)


class MissingFileError(ParamError, FileNotFoundError):
    """A file that must exist does not: a FileNotFoundError whose message may name a parameter."""


def check_regular_file(what: str, path: Path, expected: str) -> None:
    """A clear error for a path that exists but is not a regular file (a directory, a device …:
    :class:`ParamError`) and for a missing one (:class:`MissingFileError`). ``what`` names the
    file in the message: plain words (``"token file"``) or a parameter (``"{ledger}"``)."""
    if path.is_file():
        return
    if path.exists():
        raise ParamError(
            f"{what} {{path}} is a directory or not a regular file; expected {{expected}}",
            path=str(path),
            expected=expected,
        )
    raise MissingFileError(f"{what} {{path}} does not exist; expected {{expected}}", path=str(path), expected=expected)
