"""The PostgreSQL ledger's array parameters, encoded once in PostgreSQL's binary array format.

psycopg adapts a Python list element by element: it inspects the elements to choose a dumper,
then dumps each one, about 100 µs of client CPU for the 15 short arrays of one round statement
(:mod:`recsvc.ledger.postgres.store`). These columns have one known element type and no NULLs, so
they are packed here with :mod:`struct` and passed through as they are (bind them with ``%b``).
Call :func:`register` on a connection before binding them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from functools import lru_cache

import psycopg
from psycopg import adapt, pq

_HEADER = struct.Struct("!iiIii")  # dimensions, has-NULLs flag, element type, length, lower bound
_EMPTY = struct.Struct("!iiI")  # an empty array has no dimensions
_INT8, _TEXT, _BYTEA, _FLOAT8 = 20, 25, 17, 701  # element type oids (pg_type)
_INT8_ARRAY, _TEXT_ARRAY, _BYTEA_ARRAY, _FLOAT8_ARRAY = 1016, 1009, 1001, 1022


class BinaryArray(bytes):
    """A one-dimensional array without NULLs, in PostgreSQL's binary format (``array_recv``)."""

    __slots__ = ()


class Int8Array(BinaryArray):
    __slots__ = ()


class TextArray(BinaryArray):
    __slots__ = ()


class ByteaArray(BinaryArray):
    __slots__ = ()


class Float8Array(BinaryArray):
    __slots__ = ()


def _header(element_oid: int, n: int) -> bytes:
    return _HEADER.pack(1, 0, element_oid, n, 1) if n else _EMPTY.pack(0, 0, element_oid)


@lru_cache(maxsize=256)
def _int8s(n: int) -> struct.Struct:
    return struct.Struct("!" + "iq" * n)


def int8_array(values: Sequence[int]) -> Int8Array:
    """``values`` (ints in the bigint range) as a ``bigint[]``."""
    n = len(values)
    try:
        body = _int8s(n).pack(*[x for v in values for x in (8, v)])
    except struct.error as exc:
        raise ValueError(f"a bigint[] parameter takes integers from -2**63 to 2**63-1: {exc}") from None
    return Int8Array(_header(_INT8, n) + body)


@lru_cache(maxsize=256)
def _float8s(n: int) -> struct.Struct:
    return struct.Struct("!" + "id" * n)


def float8_array(values: Sequence[float]) -> Float8Array:
    """``values`` as a ``double precision[]``, bit for bit."""
    n = len(values)
    return Float8Array(_header(_FLOAT8, n) + _float8s(n).pack(*[x for v in values for x in (8, v)]))


def _varlena(element_oid: int, items: Iterable[bytes]) -> bytes:
    parts = [b""]
    for b in items:
        parts += (len(b).to_bytes(4, "big"), b)
    parts[0] = _header(element_oid, (len(parts) - 1) // 2)
    return b"".join(parts)


def text_array(values: Sequence[str]) -> TextArray:
    """``values`` as a ``text[]``, UTF-8 encoded (:func:`register` sets the client encoding)."""
    return TextArray(_varlena(_TEXT, (s.encode() for s in values)))


def bytea_array(values: Sequence[bytes]) -> ByteaArray:
    """``values`` as a ``bytea[]``."""
    return ByteaArray(_varlena(_BYTEA, values))


def _passthrough(oid: int) -> type[adapt.Dumper]:
    class Dumper(adapt.Dumper):
        format = pq.Format.BINARY

        def dump(self, obj: bytes) -> bytes:
            return obj

    Dumper.oid = oid
    return Dumper


_DUMPERS = {
    Int8Array: _passthrough(_INT8_ARRAY),
    TextArray: _passthrough(_TEXT_ARRAY),
    ByteaArray: _passthrough(_BYTEA_ARRAY),
    Float8Array: _passthrough(_FLOAT8_ARRAY),
}


def register(conn: psycopg.Connection) -> None:
    """Let ``conn`` bind the arrays of this module; text travels as UTF-8."""
    conn.execute("SET client_encoding TO 'UTF8'")
    for cls, dumper in _DUMPERS.items():
        conn.adapters.register_dumper(cls, dumper)
