"""The PostgreSQL ledger's schema, its versioned migrations and the settings replicas must share.

``recsvc ledger init`` creates the tables (``recsvc_meta``, ``recsvc_budgets``,
``recsvc_requests``) and stores the settings every replica must agree on: the schema version,
the per-user budget in exact units (:mod:`recsvc.ledger.units`) and a check value of the
fingerprint key (``HMAC(key, "recsvc key check")``: it proves two replicas use the same key
without storing the key). ``recsvc ledger migrate`` applies the pending steps of
:data:`MIGRATIONS`, each in one transaction under an advisory lock. A database whose version is
newer than this recsvc reads is refused; so is a replica whose budget, budget window or key differs.

Version 2 adds renewable budgets and the audit export (as the SQLite file's version 2,
:mod:`recsvc.ledger.sqlite.schema`): ``recsvc_budgets.window_start``, ``recsvc_requests.mechanism``
(for older rows read back from the stored response by version 4's step) and the
``budget_window`` setting, which is ``lifetime`` for a database created without it.

Version 3 adds ``recsvc_budget_changes``, the record of every `recsvc ledger set-budget`
(:mod:`recsvc.ledger.budget`); the budget itself was pinned in ``recsvc_meta`` from version 1 on.

Version 4 stores each answer as typed columns instead of the service's encoded response, as the
SQLite file's version 5: ``item_ids``, ``item_rows`` (JSON arrays), ``epsilon_spent`` and
``budget_remaining`` (the doubles the answer reported). Its step (:data:`STEPS`) reads every
stored response with :func:`recsvc.ledger.migrations.read_answer`, page by page in key order, then
drops ``response``; all in the one migration transaction.

Also here, as the SQLite file's :mod:`recsvc.ledger.sqlite.schema`: connecting with errors that
name host and port but never the password (:func:`describe`, :func:`connect`), ``recsvc ledger
migrate`` (:func:`migrate_url`) and the audit export's read (:func:`read_charges`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

from recsvc.checks import ParamError
from recsvc.ledger import fingerprint
from recsvc.ledger.base import is_postgres
from recsvc.ledger.budget import BudgetChange, mismatch
from recsvc.ledger.charging import ChargeRow, ids_text
from recsvc.ledger.migrations import read_stored_answer
from recsvc.ledger.window import BudgetWindow

log = logging.getLogger(__name__)
VERSION = 4
_LOCK = 0x72656373  # pg_advisory_xact_lock key: init/migrate of several replicas take turns
_KEY_CHECK = b"recsvc key check"

# version → the statements that reach it from the version before.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE recsvc_budgets (
            user_id     text PRIMARY KEY,
            spent_units bigint NOT NULL CHECK (spent_units >= 0),
            requests    bigint NOT NULL
        )""",
        """CREATE TABLE recsvc_requests (
            user_id       text NOT NULL,
            request_id    text NOT NULL,
            fingerprint   bytea NOT NULL,
            epsilon_units bigint NOT NULL,
            response      bytea NOT NULL,
            created       timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (user_id, request_id)
        )""",
    ),
    2: (
        "ALTER TABLE recsvc_budgets ADD COLUMN window_start bigint NOT NULL DEFAULT 0",
        "ALTER TABLE recsvc_requests ADD COLUMN mechanism text NOT NULL DEFAULT ''",
        "INSERT INTO recsvc_meta VALUES ('budget_window', 'lifetime') ON CONFLICT DO NOTHING",
    ),
    3: (
        """CREATE TABLE recsvc_budget_changes (
            changed    timestamptz NOT NULL DEFAULT now(),
            old_units  bigint NOT NULL,
            new_units  bigint NOT NULL,
            changed_by text NOT NULL DEFAULT current_user
        )""",
    ),
    4: (
        "ALTER TABLE recsvc_requests ADD COLUMN item_ids text, ADD COLUMN item_rows text, "
        "ADD COLUMN epsilon_spent double precision, ADD COLUMN budget_remaining double precision",
    ),
}


def _typed_answers(conn: Any) -> None:
    """Version 4: every stored response as typed columns (a request stored without a mechanism
    takes the one its response names), then the response column dropped."""
    after: tuple[str, str] = ("", "")
    sql = (
        "SELECT user_id, request_id, mechanism, response FROM recsvc_requests WHERE (user_id, request_id) > "
        "(%s, %s) ORDER BY user_id, request_id LIMIT 512"
    )
    while rows := conn.execute(sql, after).fetchall():
        out = []
        for user, rid, mechanism, response in rows:
            old = read_stored_answer(bytes(response), user, rid)
            typed = (ids_text(old.item_ids), ids_text(old.item_rows), old.epsilon, old.remaining)
            out.append((mechanism or old.mechanism, *typed, user, rid))
        with conn.cursor() as cur:
            cur.executemany(
                "UPDATE recsvc_requests SET mechanism=%s, item_ids=%s, item_rows=%s, epsilon_spent=%s, "
                "budget_remaining=%s WHERE user_id=%s AND request_id=%s",
                out,
            )
        after = (rows[-1][0], rows[-1][1])
    conn.execute(
        "ALTER TABLE recsvc_requests DROP COLUMN response, ALTER COLUMN item_ids SET NOT NULL, "
        "ALTER COLUMN item_rows SET NOT NULL, ALTER COLUMN epsilon_spent SET NOT NULL, "
        "ALTER COLUMN budget_remaining SET NOT NULL"
    )


# version → what runs after its statements, in the same transaction.
STEPS: dict[int, Callable[[Any], None]] = {4: _typed_answers}
URL_EXPECTED = (
    "a libpq URL postgresql://USER@HOST:PORT/DATABASE (the password from a passfile, PGPASSFILE or "
    "~/.pgpass, or PGPASSWORD; any part may also come from libpq's PG* environment variables)"
)
_warned: set[str] = set()


def describe(url: str) -> str:
    """``host:port/db`` of a libpq URL, never its password (the parts the URL leaves out as libpq
    fills them in: the PG* environment variables, then its defaults); a clear error for a malformed
    one. Warns, once per process, when the URL holds a password."""
    if not is_postgres(url):
        raise ParamError("{ledger} is not a PostgreSQL URL; expected " + URL_EXPECTED)
    try:
        info = pg_conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:  # the message would quote the URL, password included
        raise ParamError("{ledger} is not a valid PostgreSQL URL; expected " + URL_EXPECTED) from None
    where = (
        f"{info.get('host') or os.environ.get('PGHOST') or 'localhost'}:"
        f"{info.get('port') or os.environ.get('PGPORT') or 5432}/"
        f"{info.get('dbname') or os.environ.get('PGDATABASE') or info.get('user') or os.environ.get('PGUSER') or ''}"
    )
    if info.get("password") and where not in _warned:
        _warned.add(where)
        log.warning(
            "--ledger for %s holds a password: any local user can read it in the process list "
            "(/proc/PID/cmdline); put it in a passfile (PGPASSFILE, or ~/.pgpass, mode 0600) instead",
            where,
        )
    return where


def scrub(text: str, url: str) -> str:
    secret = pg_conninfo.conninfo_to_dict(url).get("password")
    return text.replace(str(secret), "***") if secret else text


def connect(url: str, where: str, connect_timeout: int) -> psycopg.Connection:
    """One autocommit connection; an unreachable server or a refused login is a clear startup error."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout)
    except psycopg.Error as exc:
        raise ParamError(
            "{ledger}: cannot connect to the PostgreSQL ledger at {where} ({reason}); expected "
            "a reachable server and a database the user may use, e.g. " + URL_EXPECTED,
            where=where,
            reason=scrub(str(exc).strip().splitlines()[0], url),
        ) from None


EXPECTED = "a database prepared by `recsvc ledger init --ledger URL --budget B --fingerprint-key FILE`"


def key_check(key: bytes) -> str:
    return fingerprint.keyed(key, _KEY_CHECK).hex()


def _settings(conn: Any) -> dict[str, str] | None:
    """The stored settings, or None when the database has no recsvc ledger yet."""
    if conn.execute("SELECT to_regclass('recsvc_meta')").fetchone()[0] is None:
        return None
    return dict(conn.execute("SELECT name, value FROM recsvc_meta").fetchall())


def _check_version(found: int, where: str) -> None:
    if found > VERSION:
        raise ParamError(
            "{ledger} {where} has ledger schema version {v}, newer than this recsvc reads ({mine}); "
            "expected a ledger written by this or an older version",
            where=where,
            v=found,
            mine=VERSION,
        )


def migrate(conn: Any, where: str) -> tuple[int, int]:
    """Applies the pending migrations (autocommit connection); (version before, version after)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        settings = _settings(conn)
        if settings is None:
            raise ParamError("{ledger} {where} holds no recsvc ledger; expected " + EXPECTED, where=where)
        before = int(settings["schema_version"])
        _check_version(before, where)
        for v in range(before + 1, VERSION + 1):
            for sql in MIGRATIONS[v]:
                conn.execute(sql)
            if v in STEPS:
                STEPS[v](conn)
        conn.execute("UPDATE recsvc_meta SET value=%s WHERE name='schema_version'", (str(VERSION),))
    return before, max(before, VERSION)


def init(conn: Any, where: str, budget_units: int, key: bytes, window: BudgetWindow) -> bool:
    """Creates the ledger with these settings (True), or checks an existing one against them (False)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        if _settings(conn) is None:
            conn.execute("CREATE TABLE recsvc_meta (name text PRIMARY KEY, value text NOT NULL)")
            conn.execute(
                "INSERT INTO recsvc_meta VALUES ('schema_version', '0'), ('budget_units', %s), "
                "('key_check', %s), ('budget_window', %s)",
                (str(budget_units), key_check(key), window.name),
            )
            created = True
        else:
            created = False
    migrate(conn, where)
    check(conn, where, budget_units, key, window)
    return created


def check_readable(conn: Any, where: str) -> None:
    """Refuses a database without a recsvc ledger, or with a schema version other than this recsvc's."""
    settings = _settings(conn)
    if settings is None:
        raise ParamError("{ledger} {where} holds no recsvc ledger yet; expected " + EXPECTED, where=where)
    found = int(settings["schema_version"])
    _check_version(found, where)
    if found < VERSION:
        raise ParamError(
            "{ledger} {where} has ledger schema version {v}, older than this recsvc's {mine}; "
            "run `recsvc ledger migrate --ledger URL` first",
            where=where,
            v=found,
            mine=VERSION,
        )


def check(conn: Any, where: str, budget_units: int, key: bytes, window: BudgetWindow) -> None:
    """Refuses a database that is missing, newer, behind, or set up with another budget, window or key."""
    check_readable(conn, where)
    settings = _settings(conn)
    assert settings is not None
    stored = int(settings["budget_units"])
    if stored != budget_units:
        raise mismatch(budget_units, stored, where)
    if settings["budget_window"] != window.name:
        raise ParamError(
            "{budget_window} {got} differs from the budget window {stored} that the ledger {where} was "
            "initialised with; every replica must use the same window (expected {budget_window} {stored})",
            got=window.name,
            stored=settings["budget_window"],
            where=where,
        )
    if settings["key_check"] != key_check(key):
        raise ParamError(
            "{fingerprint_key} is not the key the ledger {where} was initialised with; every replica "
            "must use the same key file (a new key would turn every retry into a conflict)",
            where=where,
        )


def migrate_url(url: str) -> tuple[str, int, int]:
    """`recsvc ledger migrate`: (where, version before, version after)."""
    where = describe(url)
    with connect(url, where, 5) as conn:
        before, after = migrate(conn, where)
    return where, before, after


@contextmanager
def read_charges(url: str, chunk: int) -> Iterator[tuple[int, Iterator[list[ChargeRow]]]]:
    """``(number of charges, chunks of charge rows)`` of a PostgreSQL ledger (the rows of
    :func:`recsvc.ledger.sqlite.schema.read_charges`), streamed by a server-side cursor, on one
    read-only REPEATABLE READ snapshot, in (user_id, request_id) order."""
    where = describe(url)
    with connect(url, where, 5) as conn:
        check_readable(conn, where)
        conn.autocommit = False
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with conn.transaction():
            count = conn.execute("SELECT count(*) FROM recsvc_requests").fetchone()
            assert count is not None  # an aggregate returns one row
            total = int(count[0])
            with conn.cursor(name="recsvc_export") as cur:
                cur.itersize = chunk
                cur.execute(
                    "SELECT user_id, request_id, mechanism, epsilon_units, "
                    "(extract(epoch FROM created) * 1000000)::bigint FROM recsvc_requests "
                    "ORDER BY user_id, request_id"
                )
                yield total, iter(lambda: cur.fetchmany(chunk), [])


def set_budget_url(url: str, units: int) -> tuple[str, BudgetChange | None]:
    """Re-pins the database to ``units`` and records the change, in one transaction under the
    init/migrate lock: (where, the change, or None if unchanged)."""
    where = describe(url)
    with connect(url, where, 5) as conn:
        check_readable(conn, where)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            row = conn.execute("SELECT value FROM recsvc_meta WHERE name='budget_units' FOR UPDATE").fetchone()
            assert row is not None  # check_readable: an initialised ledger
            old = int(row[0])
            if old == units:
                return where, None
            conn.execute("UPDATE recsvc_meta SET value=%s WHERE name='budget_units'", (str(units),))
            made = conn.execute(
                "INSERT INTO recsvc_budget_changes(old_units, new_units) VALUES (%s, %s) "
                "RETURNING extract(epoch FROM changed)::float8, changed_by",
                (old, units),
            ).fetchone()
            assert made is not None  # RETURNING of one inserted row
            t, by = made
    return where, BudgetChange(float(t), old, units, str(by))


def read_budget_changes_url(url: str) -> list[BudgetChange]:
    where = describe(url)
    with connect(url, where, 5) as conn:
        check_readable(conn, where)
        rows = conn.execute(
            "SELECT extract(epoch FROM changed)::float8, old_units, new_units, changed_by "
            "FROM recsvc_budget_changes ORDER BY changed"
        ).fetchall()
    return [BudgetChange(float(t), int(o), int(n), str(b)) for t, o, n, b in rows]
