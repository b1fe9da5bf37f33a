"""Opening either ledger store the same way, for tests/test_ledger_conformance.py (and the
PostgreSQL-only tests): the SQLite file or a fresh PostgreSQL database of the session's cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recsvc.service.ledger_base import LedgerStore
from recsvc.service.ledger_store import open_store

DAY = 86_400

STORES = ("sqlite", "postgresql")


@dataclass
class Stores:
    """One backing ledger (a file or a database) and the key file; ``open`` may be called again
    to restart, ``close_all`` closes whatever is still open."""

    target: Path | str
    key_file: Path
    opened: list[LedgerStore] = field(default_factory=list)

    def open(self, budget: float = 1.0, pool_size: int = 8, window: str = "lifetime",
             clock: Callable[[], float] = time.time) -> LedgerStore:
        store = open_store(self.target, budget, self.key_file, pool_size=pool_size, create=True, window=window,
                           clock=clock)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def resp(tag: str):
    """A response builder whose bytes show the budget left after the spend."""
    return lambda remaining: f"{tag}|{remaining:.6f}".encode()


@dataclass
class Clock:
    """An injectable clock (Unix seconds) that tests move across budget-window boundaries."""

    now: float

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=STORES)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """Each test that takes it runs twice: on an SQLite file and on a fresh PostgreSQL database
    (import it into the test module: ``from ledger_conformance import stores``)."""
    if request.param == "sqlite":
        s = Stores(tmp_path / "ledger.db", tmp_path / "ledger.key")
    else:
        cluster = request.getfixturevalue("pg_cluster")
        s = Stores(cluster.new_database(), tmp_path / "ledger.key")
    try:
        yield s
    finally:
        s.close_all()
