"""The PostgreSQL ledger's SQL: each statement :class:`recsvc.ledger.postgres.PostgresLedger` runs,
and how its array parameters are laid out (each column one binary array,
:mod:`recsvc.ledger.postgres.arrays`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from recsvc.ledger.charging import N_STORED, REQUEST_COLUMNS, STORED_COLUMNS, Account
from recsvc.ledger.postgres.arrays import BinaryArray, bytea_array, float8_array, int8_array, text_array

# -- the statements, and how their array parameters are laid out: each column one binary array --


@lru_cache(maxsize=512)
def _values(n: int, width: int, row: str = "") -> str:
    """``n`` parameter tuples of ``width`` (or ``row``, a tuple's text): ``(%s, %s), (%s, %s)``."""
    one = row or ("%s" if width == 1 else "(" + ", ".join(["%s"] * width) + ")")
    return ", ".join([one] * n)


# The binary array of each column (:mod:`recsvc.ledger.postgres.arrays`): a (user_id, request_id)
# key, a new account (:class:`~recsvc.ledger.charging.AccountWrite`: user_id, spent_units,
# window_start, requests), an account as a pre-check read it (:class:`~recsvc.ledger.charging.Account`),
# a stored request (:meth:`recsvc.ledger.charging.RequestWrite.row`: ``REQUEST_COLUMNS``).
KEY = (text_array, text_array)
ACCOUNT = (text_array, int8_array, int8_array, int8_array)
SEEN = (int8_array, int8_array, int8_array)
REQUEST = (
    text_array,
    text_array,
    bytea_array,
    text_array,
    int8_array,
    text_array,
    text_array,
    float8_array,
    float8_array,
)


def columns(rows: Sequence[tuple[Any, ...]], kinds: tuple[Callable[[Any], BinaryArray], ...]) -> list[BinaryArray]:
    """``rows`` as one binary array per column (empty arrays for no rows)."""
    cols = list(zip(*rows, strict=True)) or [()] * len(kinds)
    return [kind(col) for kind, col in zip(kinds, cols, strict=True)]


def seen_account(row: tuple[Any, ...]) -> Account | None:
    """The account of a :data:`PRECHECKS` row; None: the user has no row."""
    s, w, n = row[N_STORED : N_STORED + 3]  # a PRECHECKS row: the stored columns, then the account's
    return None if s is None else Account(int(s), int(w), int(n))


def _stored(n_keys: int) -> str:
    return (
        f"SELECT user_id, request_id, {STORED_COLUMNS} FROM recsvc_requests WHERE (user_id, request_id) IN "
        f"({_values(n_keys, 2)})"
    )


@lru_cache(maxsize=512)
def lock_and_read(n_users: int, n_keys: int, skip: bool = True, lock_ms: int = 0) -> str:
    """Parameters: the users (sorted) twice, then the (user_id, request_id) keys. The missing rows
    are created (only those: inserting over a row another transaction is updating would wait for
    it). ``skip``: the rows another session holds are not waited for (nor returned: their users are
    set aside); otherwise they are waited for, at most ``lock_ms``."""
    return (
        "BEGIN; "
        + ("" if skip else f"SET LOCAL lock_timeout = '{lock_ms}ms'; ")
        + "INSERT INTO recsvc_budgets(user_id, spent_units, requests) SELECT u, 0, 0 FROM (VALUES "
        f"{_values(n_users, 1, '(%s)')}) AS v(u) WHERE NOT EXISTS (SELECT FROM recsvc_budgets AS b WHERE "
        "b.user_id = v.u) ON CONFLICT DO NOTHING; "
        "SELECT user_id, spent_units, window_start, requests FROM recsvc_budgets "
        f"WHERE user_id IN ({_values(n_users, 1)}) ORDER BY user_id FOR UPDATE{' SKIP LOCKED' * skip}; "
        + _stored(n_keys)
    )


# Arrays are bound as binary (%b), built by :func:`columns`. The pre-checks' read: one row per
# (user_id, request_id), in order (NULLs where nothing is stored).
_PRECHECK_ROWS = (
    ", ".join(f"q.{c}" for c in STORED_COLUMNS.split(", ")) + ", b.spent_units, b.window_start, b.requests "
    "FROM unnest(%b::text[], %b::text[]) WITH ORDINALITY AS k(u, r, i) "
    "LEFT JOIN recsvc_budgets AS b ON b.user_id = k.u "
    "LEFT JOIN recsvc_requests AS q ON q.user_id = k.u AND q.request_id = k.r"
)
PRECHECKS = "SELECT " + _PRECHECK_ROWS + " ORDER BY k.i"

# The optimistic charge (:meth:`PostgresLedger._charge_unchanged`), one statement: update the
# accounts still as read (the UPDATE locks each row and, after waiting for another transaction's
# lock, re-checks its WHERE on the row's newest version; its nested loop over the sorted arrays
# locks in user_id order, as the locking transaction does; a pooled connection waits at most
# :data:`recsvc.ledger.waits.ROUND_LOCK_S` for a row, then the round falls back to the locking
# transaction, which skips that row), create the missing ones (``s0`` −1:
# none was read), store the answers of exactly those users, and return them. Parameters: the
# users' new (u, s, w, n) and read (s0, w0, n0) accounts, the time, the requests' columns.
_STORE = (
    f"INSERT INTO recsvc_requests({REQUEST_COLUMNS}, created) SELECT u, q, f, m, e, i, r, es, br, %s FROM "
    "unnest(%b::text[], %b::text[], %b::bytea[], %b::text[], %b::bigint[], %b::text[], %b::text[], %b::float8[], "
    "%b::float8[]) AS t(u, q, f, m, e, i, r, es, br)"
)
_CHARGE_CTES = (
    "WITH v AS (SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[], "
    "%b::bigint[], %b::bigint[]) AS v(u, s, w, n, s0, w0, n0)), "
    "moved AS (UPDATE recsvc_budgets AS b SET spent_units = v.s, requests = v.n, window_start = v.w FROM v "
    "WHERE b.user_id = v.u AND b.spent_units = v.s0 AND b.requests = v.n0 AND b.window_start = v.w0 "
    "RETURNING b.user_id), "
    "created AS (INSERT INTO recsvc_budgets(user_id, spent_units, requests, window_start) SELECT u, s, n, w FROM v "
    "WHERE s0 < 0 ORDER BY u ON CONFLICT DO NOTHING RETURNING user_id), "
    "charged AS (SELECT user_id FROM moved UNION ALL SELECT user_id FROM created), "
    f"stored AS ({_STORE} WHERE u IN (SELECT user_id FROM charged)) "
)
CHARGE_UNCHANGED = _CHARGE_CTES + "SELECT user_id FROM charged"
# The same, and the pre-checks' read (:data:`PRECHECKS`, parameters after the charge's) on the
# statement's snapshot: rows (NULL, a user charged, NULLs…) and (i, NULL, the i-th read's row).
CHARGE_AND_PRECHECK = (
    _CHARGE_CTES + "SELECT NULL::bigint, user_id, NULL::bytea, NULL::text, NULL::bigint, NULL::text, NULL::text, "
    "NULL::float8, NULL::float8, NULL::bigint, NULL::bigint, NULL::bigint "
    "FROM charged UNION ALL SELECT k.i, NULL, " + _PRECHECK_ROWS
)

# One statement (a constant text, so psycopg prepares it once per connection): store the answers
# and set the users' new accounts (absolute values: the transaction holds their row locks).
WRITE = (
    f"WITH stored AS ({_STORE}) "
    "UPDATE recsvc_budgets AS b SET spent_units = v.s, requests = v.n, window_start = v.w "
    "FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::bigint[]) AS v(u, s, w, n) WHERE b.user_id = v.u"
)
