"""Checks of user-given numbers and paths shared by the parts (pipeline, harness, engines,
service). Messages name the CLI flag or file, so the one-line error says what to change."""

from __future__ import annotations

import numbers
from pathlib import Path


def check_int(flag: str, value: object, least: int) -> int:
    """``value`` as an int if it is an integer (Python or numpy, not bool) ≥ ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{flag} must be an integer ≥ {least}, got {value!r}")
    return int(value)


def check_regular_file(what: str, path: Path, expected: str) -> None:
    """A clear error for a path that exists but is not a regular file (a directory, a device …)
    and for a missing one (FileNotFoundError)."""
    if path.is_file():
        return
    if path.exists():
        raise ValueError(f"{what} {path} is a directory or not a regular file; expected {expected}")
    raise FileNotFoundError(f"{what} {path} does not exist; expected {expected}")
