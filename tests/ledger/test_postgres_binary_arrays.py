"""The ledger's pre-encoded array parameters (``recsvc.ledger.postgres.arrays``) read back by a real
PostgreSQL exactly as psycopg's own list adaptation sends them, and wrong input is refused
before anything is sent."""

from __future__ import annotations

import psycopg
import pytest

from recsvc.ledger.postgres import arrays as pg_arrays
from recsvc.ledger.postgres.arrays import bytea_array, int8_array, text_array

CASES = [
    ("bigint", int8_array, [0, 1, -1, 2**63 - 1, -(2**63), 5_000_000_000]),
    ("text", text_array, ["u", "", "ünïcødé ✓", 'a,b {c} "d" \\e', "NULL", "x" * 300]),
    ("bytea", bytea_array, [b"", b"\x00\x00", bytes(range(256)), b"\\x00"]),
]


@pytest.fixture
def conn(pg_cluster):
    with psycopg.connect(pg_cluster.new_database(), autocommit=True) as c:
        pg_arrays.register(c)
        yield c


@pytest.mark.parametrize(("sql_type", "encode", "values"), CASES, ids=[c[0] for c in CASES])
def test_arrays_read_back_as_sent_and_as_psycopg_sends_lists(conn, sql_type, encode, values) -> None:
    ours, theirs = conn.execute(f"SELECT %b::{sql_type}[], %b::{sql_type}[]", (encode(values), values)).fetchone()
    assert ours == theirs == values
    # one element at a time, and as a set-returning unnest, as the ledger's statements read them
    assert [
        r[0]
        for r in conn.execute(
            f"SELECT x FROM unnest(%b::{sql_type}[]) WITH ORDINALITY AS t(x, i) ORDER BY i", (encode(values),)
        )
    ] == values


@pytest.mark.parametrize(("sql_type", "encode"), [(t, e) for t, e, _ in CASES], ids=[c[0] for c in CASES])
def test_empty_arrays(conn, sql_type, encode) -> None:
    got, n = conn.execute(
        f"SELECT %b::{sql_type}[], cardinality(%b::{sql_type}[])", (encode([]), encode([]))
    ).fetchone()
    assert (got, n) == ([], 0)


def test_the_element_type_is_the_arrays_own(conn) -> None:
    # the server sees bigint[], text[] and bytea[] parameters, so a wrong cast fails instead of converting
    assert conn.execute(
        "SELECT pg_typeof(%b), pg_typeof(%b), pg_typeof(%b)", (int8_array([1]), text_array(["a"]), bytea_array([b"a"]))
    ).fetchone() == ("bigint[]", "text[]", "bytea[]")


def test_unnest_of_several_arrays_pairs_their_elements(conn) -> None:
    rows = conn.execute(
        "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bytea[]) AS t(u, s, f)",
        (text_array(["a", "b"]), int8_array([7, -7]), bytea_array([b"\x01", b""])),
    ).fetchall()
    assert rows == [("a", 7, b"\x01"), ("b", -7, b"")]


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1])
def test_a_number_past_bigint_is_a_clear_error(bad) -> None:
    with pytest.raises(ValueError, match=r"bigint\[\] parameter takes integers from -2\*\*63 to 2\*\*63-1"):
        int8_array([1, bad])


def test_the_encoding_is_postgresqls_binary_array_format() -> None:
    # ndim 1, no NULLs, int8 (oid 20), 2 elements from index 1; then (length 8, value) per element
    assert int8_array([1, -2]) == bytes.fromhex(
        "00000001 00000000 00000014 00000002 00000001 00000008 0000000000000001 00000008 fffffffffffffffe"
    )
    assert text_array([]) == bytes.fromhex("00000000 00000000 00000019")
