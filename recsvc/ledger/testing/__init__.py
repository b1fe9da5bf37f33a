"""Test tools for the ledger, as numpy.testing is for numpy: the conformance suite every store's
tests subclass (:mod:`.conformance`, needs pytest), a throwaway PostgreSQL cluster
(:mod:`.cluster`), and the small helpers below for opening either store the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recsvc.ledger import Ledger, LedgerObserver, open_ledger

DAY = 86_400


@dataclass
class Stores:
    """One backing ledger (an SQLite file or a PostgreSQL URL) and the key file; ``open`` may be
    called again to restart, ``close_all`` closes whatever is still open."""

    target: Path | str
    key_file: Path
    opened: list[Ledger] = field(default_factory=list)

    def open(
        self,
        budget: float = 1.0,
        pool_size: int = 8,
        window: str = "lifetime",
        clock: Callable[[], float] | None = None,
        observer: LedgerObserver | None = None,
    ) -> Ledger:
        store = open_ledger(
            self.target,
            budget,
            self.key_file,
            pool_size=pool_size,
            create=True,
            window=window,
            clock=clock,
            observer=observer,
        )
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def resp(tag: str) -> Callable[[float], bytes]:
    """A response builder whose bytes show the budget left after the spend."""
    return lambda remaining: f"{tag}|{remaining:.6f}".encode()


@dataclass
class Clock:
    """An injectable clock (Unix seconds) that tests move across budget-window boundaries."""

    now: float

    def __call__(self) -> float:
        return self.now
