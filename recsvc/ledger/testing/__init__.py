"""Test tools for the ledger, as numpy.testing is for numpy: the conformance suite every store's
tests subclass (:mod:`.conformance`, needs pytest), a throwaway PostgreSQL cluster
(:mod:`.cluster`), and the small helpers below for opening either store the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recsvc.ledger import Charge, Drawn, Ledger, LedgerObserver, Replay, open_ledger

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


def resp(tag: str) -> Drawn:
    """A drawn answer of one item, ``tag``."""
    return Drawn((tag,))


def said(charge: object, digits: int = 6) -> str:
    """A charge's answer as ``item|budget left`` (``digits`` after the point): what the tests compare."""
    assert isinstance(charge, Charge), charge
    return f"{charge.answer.item_ids[0]}|{charge.answer.remaining:.{digits}f}"


def drawn_charge(
    led: Ledger,
    user_id: str,
    request_id: str,
    digest: bytes,
    epsilon: float,
    draw: Callable[[], object],
    tag: str | None = None,
) -> Charge:
    """The service's path through the ledger: reserve, ``draw()`` holding no lock, commit its
    result (or ``tag``) as the answer's one item; a replay draws nothing."""
    got = led.reserve(user_id, request_id, digest, epsilon)
    if isinstance(got, Replay):
        return Charge(got.answer, replayed=True)
    with got:
        sample = draw()
        return led.commit(got, Drawn((str(sample) if tag is None else tag,)))


@dataclass
class Clock:
    """An injectable clock (Unix seconds) that tests move across budget-window boundaries."""

    now: float

    def __call__(self) -> float:
        return self.now
