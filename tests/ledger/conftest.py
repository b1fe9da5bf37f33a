"""Fixtures of the ledger's tests. The PostgreSQL cluster (``pg_cluster``, one per run) lives in
tests/conftest.py, which the service's replica tests share; the helpers come from
:mod:`recsvc.ledger.testing`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from recsvc.ledger.testing import Stores


@pytest.fixture(params=("sqlite", "postgresql"))
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """Each test that takes it runs twice: on an SQLite file and on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        s = Stores(tmp_path / "ledger.db", tmp_path / "ledger.key")
    else:
        s = Stores(request.getfixturevalue("pg_cluster").new_database(), tmp_path / "ledger.key")
    try:
        yield s
    finally:
        s.close_all()
