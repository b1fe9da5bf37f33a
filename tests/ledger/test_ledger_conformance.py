"""Both stores pass the ledger's conformance suite (recsvc.ledger.testing.conformance): an SQLite
file, and a fresh database of a real PostgreSQL cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from recsvc.ledger.testing.conformance import AbstractLedgerTest


class TestSQLiteLedger(AbstractLedgerTest):
    def target(self, request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
        return tmp_path / "ledger.db"


class TestPostgresLedger(AbstractLedgerTest):
    def target(self, request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
        return request.getfixturevalue("pg_cluster").new_database()
