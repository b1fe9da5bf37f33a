"""Cheap refusals before protobuf parsing: a bounded pre-scan of a request's wire format.

Parsing a message builds every repeated entry (3,000,000 ``Candidate`` objects take seconds and
hundreds of MB), so the size limits must be checked on the raw bytes first. The scan walks the
top-level fields only (tag, then skip by length), counts the entries of the repeated fields and
stops as soon as one count or the number of fields passes its limit: a refusal costs
O(limit) steps, never O(message), and allocates nothing. Only a message within the limits is
parsed. Two facts keep the scan off the common path:

* every field occurrence takes at least 2 bytes (a tag and a value), a packed double 8 and a
  packed varint (``item_rows``) 1, so a message of at most ``2 × limit`` bytes (``limit`` with a
  packed varint field) cannot exceed a limit and is parsed without scanning (a 500-candidate
  Select, ≈ 7 KB with ids, ≈ 5 KB with rows, is under the default 10,000 bytes);
* the entries of a SelectBatch are scanned one by one with the same rule, so a batch of small
  requests costs one step per request.

The message-size limit itself is gRPC's ``max_receive_message_length`` (the server never reads
a larger message). Malformed bytes (a truncated varint, a length past the end, a group or an
invalid wire type, or anything the parser rejects) are refused the same way: :class:`Refused`,
which the gate answers with INVALID_ARGUMENT and no traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import DecodeError

from recsvc.service.config import Policy

_HIGH = bytes(range(0x80, 0x100))  # continuation bytes of a varint
EXTRA_FIELDS = 64  # room for a message's singular fields (user_id, epsilon, …), once each in practice
M = TypeVar("M")


class Refused(ValueError):
    """A request refused before parsing: INVALID_ARGUMENT. The message quotes no request data."""


@dataclass(frozen=True)
class Limits:
    candidates: int = Policy.max_candidates
    history: int = Policy.max_history
    batch: int = Policy.max_batch

    @staticmethod
    def of(policy: Policy) -> Limits:
        return Limits(policy.max_candidates, policy.max_history, policy.max_batch)


@dataclass(frozen=True)
class Shape:
    """What to count in one message type: its repeated fields (number → name), all bounded by
    the same limit; ``fixed64`` fields may be packed (one length-delimited run of 8-byte values),
    ``varint`` fields too (a run of varints, one ending at each byte below 0x80); the entries of
    ``items`` are themselves messages to scan."""

    name: str
    counted: dict[int, str]
    limit: str  # a Limits field
    fixed64: frozenset[int] = frozenset()
    items: Shape | None = field(default=None)
    varint: frozenset[int] = frozenset()


SELECT = Shape("SelectRequest", {2: "candidates", 9: "item_ids", 10: "scores", 12: "item_rows"}, "candidates",
               frozenset({10}), varint=frozenset({12}))
RECOMMEND = Shape("RecommendRequest", {2: "history entries"}, "history")
BATCH = Shape("SelectBatchRequest", {1: "requests"}, "batch", items=SELECT)


def _malformed(shape: Shape) -> Refused:
    return Refused(f"the request is not a valid recsvc.v1.{shape.name} (malformed protobuf wire format); "
                   f"expected a serialized {shape.name} (proto/recsvc/v1/selection.proto)")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position); IndexError past the end, ValueError beyond 10 bytes."""
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    value, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = data[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` as it goes on the wire (tag, length, bytes): the
    inverse of :func:`fields` for wire type 2. The tests and the refusal benchmark build raw
    messages with it, huge or malformed, that protobuf's encoder would build slowly or not at all."""
    return _varint_bytes(number << 3 | 2) + _varint_bytes(len(payload)) + payload


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) of each top-level field in data[pos:end]."""
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        start = pos
        if wire_type == 0:
            _, pos = _varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            length, start = _varint(data, pos)
            pos = start + length
        elif wire_type == 5:
            pos += 4
        else:  # 3/4: groups (not in proto3 messages); 6/7: not wire types
            raise ValueError(f"wire type {wire_type}")
        if number == 0 or pos > end:
            raise ValueError("field number 0 or a value past the end")
        yield number, wire_type, start, pos


def check(data: bytes, shape: Shape, limits: Limits, pos: int = 0, end: int | None = None) -> None:
    """Raises :class:`Refused` if data[pos:end] has more entries in a counted field (or more
    fields) than the limits allow, or is not well-formed wire format at its top level."""
    end = len(data) if end is None else end
    limit = getattr(limits, shape.limit)
    if shape.items is None and end - pos <= (1 if shape.varint else 2) * limit:
        return  # every entry takes ≥ 2 bytes (≥ 1 packed varint): no count can pass the limit
    counts = dict.fromkeys(shape.counted, 0)
    most = len(counts) * limit + EXTRA_FIELDS
    total = 0
    try:
        for number, wire_type, start, stop in fields(data, pos, end):
            total += 1
            if total > most:
                raise Refused(f"more than {most} fields in one {shape.name}; this server accepts at most "
                              f"{limit} {'/'.join(shape.counted.values())} per {shape.name}")
            if number not in counts:
                continue
            if wire_type == 2 and number in shape.fixed64:
                counts[number] += (stop - start + 7) // 8
            elif wire_type == 2 and number in shape.varint:  # C-speed count, on at most 10 × limit bytes
                run = min(stop - start, 10 * limit + 10)
                counts[number] += len(data[start:start + run].translate(None, _HIGH))
            else:
                counts[number] += 1
            if counts[number] > limit:
                raise Refused(f"more than {limit} {shape.counted[number]} in one {shape.name}; "
                              f"this server accepts at most {limit}")
            if shape.items is not None and wire_type == 2:
                try:
                    check(data, shape.items, limits, start, stop)
                except Refused as exc:
                    raise Refused(f"{shape.counted[number]}[{counts[number] - 1}]: {exc}") from None
    except (IndexError, ValueError) as exc:
        if isinstance(exc, Refused):
            raise
        raise _malformed(shape) from None


def decoder(message_type: Callable[..., M], shape: Shape, limits: Limits) -> Callable[[bytes], M]:
    """A request deserializer: the bounded pre-scan, then the protobuf parser."""

    def decode(data: bytes) -> M:
        check(data, shape, limits)
        try:
            return message_type.FromString(data)  # type: ignore[attr-defined]
        except DecodeError:
            raise _malformed(shape) from None

    return decode
