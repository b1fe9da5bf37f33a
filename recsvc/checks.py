"""Checks of user-given numbers shared by the pipeline's and the harness's configs and the
engines. Messages name the CLI flag, so the one-line error says what to change."""

from __future__ import annotations

import numbers


def check_int(flag: str, value: object, least: int) -> int:
    """``value`` as an int if it is an integer (Python or numpy, not bool) ≥ ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{flag} must be an integer ≥ {least}, got {value!r}")
    return int(value)
