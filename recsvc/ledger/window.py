"""Renewable budgets (``--budget-window``): ε per user per UTC-aligned window, or over all time.

``lifetime`` (the default) is one window that never ends: every charge counts forever. ``Nd``
(1d, 7d, 30d, … up to 36500d) is a window of N days, aligned to the Unix epoch in UTC: window i
covers [i·N·86400, (i+1)·N·86400) seconds since 1970-01-01T00:00Z, so 1d windows start at 00:00
UTC and 7d windows at 00:00 UTC on Thursdays (1970-01-01 was a Thursday). Hours are not accepted:
a window shorter than a day renews ε faster than any per-day privacy policy means, and multiplies
the over-time exposure by 24 or more.

What it means for the guarantee: a user's data is protected at ε per window, NOT over all time.
Over T windows the answers about one user compose to at most T·ε (basic composition). Windows are
fixed, not sliding, so ε spent in the last second of a window and ε in the first second of the
next are 2ε released within moments of each other around the boundary.

A budget row stores ``(spent_units, window_start)``. The spend in the current window is
``spent_units`` if the row's window started at or after the current window's start, else 0
(a charge then starts the row's new window). A row's window never moves backwards, so a replica
whose clock lags another's still charges against the later window: clock skew between replicas
can delay a renewal, never grant one early twice. PostgreSQL replicas take the time from the
database server (:mod:`recsvc.ledger.postgres.clock`), so a fast replica clock renews nothing early. Stdlib only (the service's configuration
parses the flag with it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from recsvc.checks import ParamError

DAY = 86_400
MAX_DAYS = 36_500
LIFETIME = "lifetime"
EXPECTED = f"'{LIFETIME}' or a number of days such as 1d, 7d or 30d (1d to {MAX_DAYS}d; hours are not accepted)"


@dataclass(frozen=True)
class BudgetWindow:
    """``days`` = 0: lifetime (one window starting at 0 that never ends)."""

    days: int = 0

    @staticmethod
    def parse(text: object) -> BudgetWindow:
        """``lifetime`` or ``Nd``; anything else is a ParamError naming ``--budget-window``."""
        if isinstance(text, BudgetWindow):
            return text
        s = str(text).strip()
        if s == LIFETIME:
            return BudgetWindow(0)
        m = re.fullmatch(r"([0-9]+)d", s)
        if m is None or not 1 <= int(m.group(1)) <= MAX_DAYS:
            raise ParamError("{budget_window} {got!r} is not a budget window; expected " + EXPECTED, got=s)
        return BudgetWindow(int(m.group(1)))

    @property
    def name(self) -> str:
        return LIFETIME if self.days == 0 else f"{self.days}d"

    @property
    def per(self) -> str:
        """How the budget is meant, for messages: ``over all time`` or ``per 7d window (UTC)``."""
        return "over all time" if self.days == 0 else f"per {self.name} window (UTC)"

    @property
    def seconds(self) -> int:
        return self.days * DAY

    def start(self, now: float) -> int:
        """Unix second at which the window holding ``now`` starts (0 for lifetime)."""
        return 0 if self.days == 0 else int(now // self.seconds) * self.seconds

    def end(self, start: int) -> int:
        """Unix second at which the window starting at ``start`` ends (0 for lifetime: never)."""
        return 0 if self.days == 0 else start + self.seconds

    @staticmethod
    def in_window(spent_units: int, row_start: int, start: int) -> tuple[int, int]:
        """(spend counted against the budget now, the window it counts in) for a row
        ``(spent_units, row_start)`` when the clock's window starts at ``start``: the row's own
        spend if its window is current (or later: another replica's clock is ahead), else 0 in
        the clock's window."""
        return (spent_units, row_start) if row_start >= start else (0, start)

    def spent_now(self, rows: Iterable[tuple[str, int, int]], now: float) -> dict[str, int]:
        """Each user's spend counted against the budget at ``now``, from stored rows
        ``(user_id, spent_units, window_start)``."""
        start = self.start(now)
        return {u: self.in_window(int(s), int(ws), start)[0] for u, s, ws in rows}


LIFETIME_WINDOW = BudgetWindow(0)
