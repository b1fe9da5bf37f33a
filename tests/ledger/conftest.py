"""Fixtures of the ledger's tests. The PostgreSQL cluster (``pg_cluster``, one per run) lives in
tests/conftest.py, which the service's replica tests share; the helpers come from
:mod:`recsvc.ledger.testing`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from recsvc.ledger import Ledger, Replay
from recsvc.ledger.testing import Stores
from recsvc.service import codec
from recsvc.service.multiselect import charged_answer
from recsvc.service.requests import Selected

FIXTURES = Path(__file__).parent / "fixtures"


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


@dataclass(frozen=True)
class V4Ledger:
    """fixtures/ledger-v4.db, written by the ledger and codec of SQLite file version 4 (commit
    cc35b8f: ``SQLiteLedger.draw_and_charge`` storing ``codec.encode`` or ``codec.encode_multiselect``
    of each answer, then a retry of each), which stored each answer as its encoded response (Select
    slates with and without rows, a non-ASCII id, an ε of one unit, a MultiSelect);
    fixtures/ledger-v4.json records each request's digest and the bytes that code sent first and on
    the retry (``codec.answer``), and each user's spend."""

    budget: float
    requests: dict[str, dict[str, Any]]
    spent_units: dict[str, int]

    def copy_to(self, directory: Path) -> Path:
        """The ledger file and its key, copied into ``directory``: the copy's path."""
        for name in ("ledger-v4.db", "ledger-v4.db.key"):
            shutil.copyfile(FIXTURES / name, directory / name)
            (directory / name).chmod(0o600)  # as the ledger creates them; a checkout may leave 0644
        return directory / "ledger-v4.db"

    def check_replays(self, led: Ledger) -> None:
        """Every recorded request replays on ``led``, its first answer and its replay re-encoded
        byte for byte, and every user's spend is unchanged."""
        for key, r in self.requests.items():
            user, rid = key.split("/")
            got = led.reserve(user, rid, bytes.fromhex(r["digest"]), r["epsilon"])
            assert isinstance(got, Replay), key
            for replayed, sent in ((False, r["first"]), (True, r["replay"])):
                message = (
                    codec.select_response(Selected(got.answer, rid, replayed))
                    if r["kind"] == "select"
                    else codec.multiselect_message(charged_answer(got.answer, rid, replayed))
                )
                assert message.SerializeToString() == bytes.fromhex(sent), (key, replayed)
        assert {u: led.user(u).spent_units for u in self.spent_units} == self.spent_units


@pytest.fixture
def v4_ledger() -> V4Ledger:
    recorded = json.loads((FIXTURES / "ledger-v4.json").read_text())
    return V4Ledger(recorded["budget"], recorded["requests"], recorded["spent_units"])
