"""What both stores' migrations share: reading the answers older ledgers stored as encoded bytes.

Ledgers up to SQLite file version 4 and PostgreSQL schema version 3 stored each answer as the
service's serialized response (a ``SelectResponse``, or a ``MultiSelectResponse`` for the
``multiselect`` mechanism); the current formats store typed columns
(:class:`~recsvc.ledger.charging.StoredAnswer`). Converting them needs only a few fields, so they
are read here with a minimal protobuf wire reader instead of the service's generated stubs: the
ledger never imports the service, and these byte layouts are frozen (only old ledgers hold them,
and proto/recsvc/v1/selection.proto never renumbers a field).

The fields read, by number (proto3 wire format; an absent field is its zero value):

* ``SelectResponse``: 1 ``item_id``, 2 ``mechanism``, 3 ``epsilon_spent``, 4 ``budget_remaining``,
  7 ``item_ids`` (repeated), 8 ``item_rows`` (packed uint32). An answer stored with ``item_id``
  alone has that one item as its slate, as its replay always said.
* ``MultiSelectResponse``: 1 ``item_ids`` (repeated), 2 ``epsilon_spent``, 3 ``budget_remaining``.

The two are told apart by field 2's wire type: a string (the mechanism) in a ``SelectResponse``,
a double in a ``MultiSelectResponse``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from recsvc.checks import ParamError

_DOUBLE = struct.Struct("<d")


class UnreadableAnswer(ValueError):
    """A stored response that is not a serialized SelectResponse or MultiSelectResponse."""


@dataclass(frozen=True, slots=True)
class OldAnswer:
    """The typed fields of an answer a ledger stored as bytes."""

    item_ids: tuple[str, ...]
    item_rows: tuple[int, ...]
    mechanism: str  # '' for a MultiSelectResponse: the stored row names it
    epsilon: float
    remaining: float


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise UnreadableAnswer("a varint longer than 10 bytes")


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(number, wire type, value) of each field: bytes for lengths and fixed64s, an int for varints."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _varint(data, pos)
            yield number, kind, value
        elif kind in (1, 2, 5):
            size, start = (8, pos) if kind == 1 else (4, pos) if kind == 5 else _varint(data, pos)
            end = start + size
            if end > len(data):
                raise UnreadableAnswer("a field past the end")
            yield number, kind, data[start:end]
            pos = end
        else:
            raise UnreadableAnswer(f"wire type {kind}")


def _packed(run: bytes) -> Iterator[int]:
    pos = 0
    while pos < len(run):
        value, pos = _varint(run, pos)
        yield value


def read_answer(response: bytes) -> OldAnswer:
    """The typed fields of a stored ``SelectResponse`` or ``MultiSelectResponse`` (module docstring)."""
    try:
        fields = list(_fields(bytes(response)))
    except IndexError:
        raise UnreadableAnswer("a truncated field") from None
    multi = any(n == 2 and kind == 1 for n, kind, _ in fields)
    numbers = {"ids": 1, "eps": 2, "rem": 3} if multi else {"ids": 7, "eps": 3, "rem": 4}
    ids: list[str] = []
    rows: list[int] = []
    first = mechanism = ""
    eps = rem = 0.0
    try:
        for n, kind, value in fields:
            if n == numbers["ids"] and isinstance(value, bytes):
                ids.append(value.decode())
            elif n in (numbers["eps"], numbers["rem"]) and kind == 1 and isinstance(value, bytes):
                eps, rem = (_DOUBLE.unpack(value)[0], rem) if n == numbers["eps"] else (eps, _DOUBLE.unpack(value)[0])
            elif multi:
                continue
            elif n == 1 and isinstance(value, bytes):
                first = value.decode()
            elif n == 2 and isinstance(value, bytes):
                mechanism = value.decode()
            elif n == 8:
                rows.extend(_packed(value) if isinstance(value, bytes) else (value,))
    except UnicodeDecodeError:
        raise UnreadableAnswer("a string that is not UTF-8") from None
    if not ids and first:
        ids = [first]
    return OldAnswer(tuple(ids), tuple(rows), mechanism, eps, rem)


def read_stored_answer(response: bytes, user: str, rid: str) -> OldAnswer:
    """:func:`read_answer` of the request (``user``, ``rid``), or the refusal of the migration that
    names it: every store's migration refuses an unreadable answer the same way, changing nothing."""
    try:
        return read_answer(response)
    except UnreadableAnswer as exc:
        raise ParamError(
            "{ledger}: the stored answer of user_id {user} request_id {rid} cannot be read ({reason}); "
            "expected a ledger written by `recsvc serve`",
            user=repr(user),
            rid=repr(rid),
            reason=str(exc),
        ) from None
