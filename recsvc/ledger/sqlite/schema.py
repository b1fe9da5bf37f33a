"""The SQLite ledger file: its schema, its version, and the migration of older files (its path
checks and file modes: :mod:`recsvc.ledger.sqlite.files`).

Version 1 (``PRAGMA user_version = 1``) stores ε as integer units (:mod:`recsvc.ledger.units`)
and keyed fingerprints (:mod:`recsvc.ledger.fingerprint`). Version 0 is the first file format:
``budgets.spent`` and ``requests.epsilon`` as REAL, and each fingerprint an unsalted SHA-256 of
the request. Opening a version-0 file migrates it, once, in one transaction:

* each request's ε becomes ⌈ε·10¹²⌉ units of its exact binary value, and each user's total the
  larger of ⌈spent·10¹²⌉ and the sum of its requests' units: rounding only ever adds spend (a
  float total that had swallowed tiny charges is restored from the requests);
* each fingerprint ``f`` becomes ``HMAC(key, f)``, which is exactly what a retry of that request
  computes (the service's digest is the version-0 fingerprint), so version-0 request_ids still replay;
* the version-0 rows are deleted with ``secure_delete`` and the WAL is checkpointed and truncated,
  so no unsalted fingerprint is left in the ledger's files (copies made elsewhere remain readable).

Version 2 adds renewable budgets and the audit export: ``budgets.window_start`` (the Unix second
at which the row's budget window started, 0 for lifetime; :mod:`recsvc.ledger.window`),
``requests.mechanism`` (for ``recsvc ledger export``) and a ``settings`` table holding the
``budget_window`` every process on the file must use. A version-1 file (or a version-0 file, after
the step above) is migrated in the same one transaction: its budget window is ``lifetime`` (what
it was written under), and each request's mechanism is read back from its stored response
(by the version-5 step below).

Version 3 changes only the layout of ``requests``: a rowid table, appended in commit order, plus a
UNIQUE index on ``(user_id, request_id)``, instead of a WITHOUT ROWID table keyed by it. Request
ids are random, so in a table keyed by them a commit of 100 charges dirties ~100 leaf pages of
rows that carry the whole stored answer; appended, it dirties the table's last pages and the
leaves of the much smaller index, which lookups, replays and the export read in key order. An
older file (after the steps above) is rebuilt in the same one transaction: the rows are copied in
``created`` order, unchanged.

Version 4 pins the budget (:mod:`recsvc.ledger.budget`): the ``settings`` row ``budget_units``, and a
``budget_changes`` table recording every `recsvc ledger set-budget`. An older file is pinned, in the
same one transaction, to the budget of the process that opens it first; from then on a process
with another budget is refused.

Version 5 stores each answer as typed columns instead of the service's encoded response
(:class:`~recsvc.ledger.charging.StoredAnswer`): ``item_ids`` and ``item_rows`` (JSON arrays, the
slate in selection order), ``epsilon_spent`` and ``budget_remaining`` (the doubles the answer
reported), next to ``mechanism`` and ``epsilon_units``. An older file (after the steps above) is
rebuilt in the same one transaction, in commit order: each stored response is read by
:func:`recsvc.ledger.migrations.read_answer` (a request stored without a mechanism takes the one
its response names), so every replay re-encodes the answer it always returned. A response that
cannot be read refuses the open, the file left as it was.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recsvc.checks import MissingFileError, ParamError
from recsvc.ledger import fingerprint
from recsvc.ledger.budget import BudgetChange, mismatch, os_user
from recsvc.ledger.charging import ChargeRow, ids_text
from recsvc.ledger.migrations import read_stored_answer
from recsvc.ledger.sqlite.files import WRITTEN, check_foreign, check_path
from recsvc.ledger.units import float_units_up
from recsvc.ledger.window import LIFETIME, BudgetWindow

log = logging.getLogger("recsvc.ledger")
VERSION = 5
# Rows per multi-row statement: 10 × 64 bound parameters stay far below SQLite's limits.
CHUNK = 64

# budgets and settings are WITHOUT ROWID (the primary key is the row). requests is a rowid table
# appended in commit order with a unique index on the key (see the module docstring: version 3).
_REQUESTS = """CREATE TABLE IF NOT EXISTS requests (
    user_id          TEXT NOT NULL,
    request_id       TEXT NOT NULL,
    fingerprint      BLOB NOT NULL,
    epsilon_units    INTEGER NOT NULL,
    created          REAL NOT NULL,
    mechanism        TEXT NOT NULL,
    item_ids         TEXT NOT NULL,
    item_rows        TEXT NOT NULL,
    epsilon_spent    REAL NOT NULL,
    budget_remaining REAL NOT NULL
)"""
# The layout of versions 3 and 4, which the steps to version 4 build.
_REQUESTS_V4 = """CREATE TABLE IF NOT EXISTS requests (
    user_id       TEXT NOT NULL,
    request_id    TEXT NOT NULL,
    fingerprint   BLOB NOT NULL,
    epsilon_units INTEGER NOT NULL,
    response      BLOB NOT NULL,
    created       REAL NOT NULL,
    mechanism     TEXT NOT NULL DEFAULT ''
)"""
_REQUESTS_KEY = "CREATE UNIQUE INDEX IF NOT EXISTS requests_key ON requests (user_id, request_id)"
_SETTINGS = "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
_BUDGET_CHANGES = (
    "CREATE TABLE IF NOT EXISTS budget_changes (changed REAL NOT NULL, old_units INTEGER NOT NULL, "
    "new_units INTEGER NOT NULL, changed_by TEXT NOT NULL)"
)
_TABLES = (
    """CREATE TABLE IF NOT EXISTS budgets (
    user_id      TEXT PRIMARY KEY,
    spent_units  INTEGER NOT NULL,
    requests     INTEGER NOT NULL,
    window_start INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID""",
    _REQUESTS,
    _REQUESTS_KEY,
    _SETTINGS,
    _BUDGET_CHANGES,
)
_V2 = (
    "ALTER TABLE budgets ADD COLUMN window_start INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE requests ADD COLUMN mechanism TEXT NOT NULL DEFAULT ''",
    _SETTINGS,
)
_COLUMNS = "user_id, request_id, fingerprint, epsilon_units, response, created, mechanism"
_V3 = (
    "ALTER TABLE requests RENAME TO requests_v2",
    _REQUESTS_V4,
    _REQUESTS_KEY,
    f"INSERT INTO requests ({_COLUMNS}) SELECT {_COLUMNS} FROM requests_v2 ORDER BY created, user_id, request_id",
    "DROP TABLE requests_v2",
)


def version(conn: sqlite3.Connection) -> int | None:
    """None: no ledger tables yet; 0: the float/unsalted schema; else ``PRAGMA user_version``."""
    cols = {row[1] for row in conn.execute("PRAGMA table_info(budgets)")}
    if not cols:
        return None
    if "spent" in cols:
        return 0
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def has_requests(conn: sqlite3.Connection) -> bool:
    return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM requests)").fetchone()[0] == 1)


def create(conn: sqlite3.Connection) -> None:
    """The current schema (inside the caller's transaction)."""
    for sql in _TABLES:
        conn.execute(sql)
    conn.execute(f"PRAGMA user_version = {VERSION}")


def _typed(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A version-4 row ``(user_id, request_id, fingerprint, epsilon_units, created, mechanism,
    response)`` as the current columns (:data:`_TYPED`)."""
    user, rid, fp, units, created, mechanism, response = row
    old = read_stored_answer(bytes(response), user, rid)
    return (
        user,
        rid,
        fp,
        units,
        created,
        mechanism or old.mechanism,
        ids_text(old.item_ids),
        ids_text(old.item_rows),
        old.epsilon,
        old.remaining,
    )


_TYPED = (
    "INSERT INTO requests(user_id, request_id, fingerprint, epsilon_units, created, mechanism, item_ids, item_rows, "
    "epsilon_spent, budget_remaining) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def migrate_v4(conn: sqlite3.Connection) -> None:
    """Version 4 → 5 inside the caller's write transaction: ``requests`` rebuilt with typed answers."""
    conn.execute("ALTER TABLE requests RENAME TO requests_v4")
    conn.execute("DROP INDEX requests_key")  # the old table's; the new one gets its own below
    conn.execute(_REQUESTS)
    conn.execute(_REQUESTS_KEY)
    rows = conn.execute(
        "SELECT user_id, request_id, fingerprint, epsilon_units, created, mechanism, response FROM requests_v4 "
        "ORDER BY rowid"
    )
    while batch := rows.fetchmany(512):
        conn.executemany(_TYPED, [_typed(r) for r in batch])
    conn.execute("DROP TABLE requests_v4")


def check_window(conn: sqlite3.Connection, path: Path, window: BudgetWindow) -> None:
    """Refuses a budget window other than the one the file was created with (every worker and
    every restart must count ε over the same windows)."""
    row = conn.execute("SELECT value FROM settings WHERE name='budget_window'").fetchone()
    if row is None:
        conn.execute("INSERT INTO settings VALUES ('budget_window', ?)", (window.name,))
    elif row[0] != window.name:
        raise ParamError(
            "{budget_window} {got} differs from the budget window {stored} that the ledger {path} was "
            "created with; every process on one ledger must use the same window, and a ledger's window "
            "is fixed when it is created (expected {budget_window} {stored}, or a new ledger)",
            got=window.name,
            stored=row[0],
            path=str(path),
        )


def check_budget(conn: sqlite3.Connection, path: Path, budget_units: int) -> None:
    """Pins a new (or version ≤ 3) file to ``budget_units``; refuses any other budget after that."""
    row = conn.execute("SELECT value FROM settings WHERE name='budget_units'").fetchone()
    if row is None:
        conn.execute("INSERT INTO settings VALUES ('budget_units', ?)", (str(budget_units),))
    elif int(row[0]) != budget_units:
        raise mismatch(budget_units, int(row[0]), str(path))


def migrate_v0(conn: sqlite3.Connection, keyed: Callable[[bytes], bytes]) -> None:
    """Version 0 → 1 inside the caller's write transaction (see the module docstring)."""
    conn.execute("PRAGMA secure_delete = ON")  # dropped rows are zeroed, not left in free pages
    conn.execute("ALTER TABLE budgets RENAME TO budgets_v0")
    conn.execute("ALTER TABLE requests RENAME TO requests_v0")
    create(conn)
    spent: dict[str, int] = {}
    counts: dict[str, int] = {}
    rows = conn.execute("SELECT user_id, request_id, fingerprint, epsilon, response, created FROM requests_v0")
    while batch := rows.fetchmany(CHUNK):
        out = []
        for user, rid, fp, eps, resp, created in batch:
            units = float_units_up(float(eps))
            spent[user] = spent.get(user, 0) + units
            counts[user] = counts.get(user, 0) + 1
            out.append(_typed((user, rid, keyed(bytes(fp)), units, float(created), "", bytes(resp))))
        conn.executemany(_TYPED, out)
    totals = {
        u: (float_units_up(float(s)), int(n))
        for u, s, n in conn.execute("SELECT user_id, spent, requests FROM budgets_v0")
    }
    for user in spent.keys() - totals.keys():  # a request without a budget row: count it anyway
        totals[user] = (0, counts[user])
    conn.executemany(
        "INSERT INTO budgets(user_id, spent_units, requests) VALUES (?, ?, ?)",
        [(u, max(s, spent.get(u, 0)), n) for u, (s, n) in totals.items()],
    )
    conn.execute("DROP TABLE budgets_v0")
    conn.execute("DROP TABLE requests_v0")


def open_file(
    conn: sqlite3.Connection,
    path: Path,
    key_file: Path,
    window: BudgetWindow,
    budget_units: int,
    retry: Callable[[Callable[[], object]], None],
) -> tuple[bytes, bool]:
    """Creates, checks or migrates the ledger in one write transaction (processes opening it at
    once take turns), checks its budget window and budget, and loads or creates the fingerprint key:
    (key, created). A refusal rolls everything back: the file is left as it was."""
    retry(lambda: conn.execute("BEGIN IMMEDIATE"))
    created = False
    try:
        found = version(conn)
        if found is not None and found > VERSION:
            raise ParamError(
                "{ledger} {path} has format version {v}, newer than this recsvc reads ({mine}); "
                "expected a ledger written by this or an older version",
                path=str(path),
                v=found,
                mine=VERSION,
            )
        if found is not None and found >= 1 and not key_file.exists() and has_requests(conn):
            raise ParamError(
                "{fingerprint_key} {key} is missing, but the ledger {path} stores requests fingerprinted "
                "with it; expected the key file the ledger was written with (a new key would turn every "
                "retry of a stored request into a conflict)",
                key=str(key_file),
                path=str(path),
            )
        key, created = fingerprint.load_or_create(key_file)
        if found is None:
            create(conn)
        elif found == 0:
            migrate_v0(conn, lambda fp: fingerprint.keyed(key, fp))  # straight to the current tables
        if found == 1:  # version 1 → 2 (module docstring)
            for sql in _V2:
                conn.execute(sql)
        if found in (1, 2):  # version 2 → 3: requests rebuilt as a rowid table
            for sql in _V3:
                conn.execute(sql)
        if found in (1, 2, 3):
            conn.execute(_BUDGET_CHANGES)
        if found in (1, 2, 3, 4):
            migrate_v4(conn)
            conn.execute(f"PRAGMA user_version = {VERSION}")
        if found is not None and found < 2:  # written under lifetime budgets
            conn.execute("INSERT INTO settings VALUES ('budget_window', ?)", (LIFETIME,))
        check_window(conn, path, window)
        check_budget(conn, path, budget_units)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if created:  # nothing was written with it
            key_file.unlink(missing_ok=True)
        raise
    if found == 0:  # the migration's dropped pages are zeroed; empty the WAL that held them too
        conn.execute("PRAGMA secure_delete = OFF")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return key, created


@contextmanager
def read_charges(path: Path, chunk: int) -> Iterator[tuple[int, Iterator[list[ChargeRow]]]]:
    """``(number of charges, chunks of charge rows)`` of an SQLite ledger, read-only, on one
    snapshot, in (user_id, request_id) order, ``chunk`` rows at a time."""
    conn = _current(Path(path), readonly=True)
    try:
        conn.execute("BEGIN")  # one snapshot for the count and the rows
        total = int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])
        rows = conn.execute(
            "SELECT user_id, request_id, mechanism, epsilon_units, CAST(round(created * 1000000) AS "
            "INTEGER) FROM requests ORDER BY user_id, request_id"
        )
        yield total, iter(lambda: rows.fetchmany(chunk), [])
    finally:
        conn.close()


def _current(path: Path, readonly: bool = False) -> sqlite3.Connection:
    """A connection to an existing ledger file of the current version (else a clear error)."""
    if not path.exists():
        raise MissingFileError("{ledger} {path} does not exist; expected " + WRITTEN, path=str(path))
    check_path(path)
    check_foreign(path)
    uri = path.resolve().as_uri() + ("?mode=ro" if readonly else "")
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=60)
    found = version(conn)
    if found is None or found != VERSION:
        conn.close()
        if found is None:
            raise ParamError("{ledger} {path} holds no recsvc ledger; expected " + WRITTEN, path=str(path))
        raise ParamError(
            "{ledger} {path} has format version {v}; expected a ledger of version {mine}: open it once "
            "with this recsvc (`recsvc ledger init --ledger {path}`, or `recsvc serve`) to migrate it",
            path=str(path),
            v=found,
            mine=VERSION,
        )
    return conn


def set_budget_file(path: Path, units: int) -> BudgetChange | None:
    """Re-pins the file to ``units`` and records the change, in one write transaction; None if unchanged."""
    conn = _current(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        old = int(conn.execute("SELECT value FROM settings WHERE name='budget_units'").fetchone()[0])
        if old == units:
            conn.execute("ROLLBACK")
            return None
        change = BudgetChange(time.time(), old, units, os_user())
        conn.execute("UPDATE settings SET value=? WHERE name='budget_units'", (str(units),))
        conn.execute(
            "INSERT INTO budget_changes VALUES (?, ?, ?, ?)",
            (change.time, change.old_units, change.new_units, change.changed_by),
        )
        conn.execute("COMMIT")
        return change
    finally:
        conn.close()


def read_budget_changes_file(path: Path) -> list[BudgetChange]:
    conn = _current(path, readonly=True)
    try:
        rows = conn.execute("SELECT changed, old_units, new_units, changed_by FROM budget_changes ORDER BY rowid")
        return [BudgetChange(float(t), int(o), int(n), str(b)) for t, o, n, b in rows]
    finally:
        conn.close()
