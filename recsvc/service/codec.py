"""The service's wire format: a bounded pre-scan of each request and the message codecs.

**Cheap refusals before protobuf parsing.**

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
* a SelectBatch's top level is scanned (one step per request); its requests are then checked
  as they are parsed, and their candidates in all bounded by ``max_batch_candidates``
  (:func:`_parse_items`, decision 0004).

The message-size limit itself is gRPC's ``max_receive_message_length`` (the server never reads
a larger message). The server never decompresses a request (``grpc.per_message_decompression``
is off, :func:`recsvc.service.admission.channel_options`): a compressed message reaches the scan
as its compressed bytes, which are not the wire format of any request. Malformed bytes (a
truncated varint, a length past the end, a group or an invalid wire type, or anything the parser
rejects) are refused the same way: :class:`Refused`, which the gate answers with
INVALID_ARGUMENT and no traceback.

**Codecs.** :func:`candidates`, :func:`params` and :func:`fingerprint` read a decoded request;
:func:`select_response` makes the SelectResponse of a charged request from its typed answer (the
one encoding of an answer, fresh or replayed).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from google.protobuf.message import DecodeError

from recsvc.mechanisms import MECHANISMS, PARAM_NAMES
from recsvc.service.config import Limits, SelectorConfig
from recsvc.service.errors import InvalidRequest, Refused
from recsvc.service.multiselect import MultiAnswer
from recsvc.service.requests import SelectInput
from recsvc.v1 import selection_pb2 as pb

if TYPE_CHECKING:
    from recsvc.service.multiselect import MultiSelector
    from recsvc.service.requests import Selected
    from recsvc.service.selection import Selector

_HIGH = bytes(range(0x80, 0x100))  # continuation bytes of a varint
EXTRA_FIELDS = 64  # room for a message's singular fields (user_id, epsilon, …), once each in practice
# A batch item over this many × its limit bytes is scanned before it is parsed: parsing is ≈ 50×
# faster than the scan per entry, and this bounds what parsing one item may build (≤ 640k entries,
# ≈ 40 MB with the default limit) before its counts are known.
SCANNED_ITEM = 64
# A SelectBatch of at most this many bytes is parsed at once, then counted: ≈ 0.2 CPU-s and
# +110 MB at most, however its entries are packed (4 MiB of empty candidates, the worst case).
WHOLE_BATCH = 4 * 1024 * 1024
M = TypeVar("M")


@dataclass(frozen=True)
class Shape:
    """What to count in one message type: its repeated fields (number → name), all bounded by
    the same limit; ``fixed64`` fields may be packed (one length-delimited run of 8-byte values),
    ``varint`` fields too (a run of varints, one ending at each byte below 0x80); the entries of
    ``items`` are messages of that shape, checked one by one as they are parsed (:func:`_parse_items`)."""

    name: str
    counted: dict[int, str]
    limit: str  # a Limits field (recsvc.service.config.Limits)
    fixed64: frozenset[int] = frozenset()
    items: Shape | None = field(default=None)
    varint: frozenset[int] = frozenset()
    total: str | None = None  # a Limits field: the most candidates of all the ``items`` together


SELECT = Shape(
    "SelectRequest",
    {2: "candidates", 9: "item_ids", 10: "scores", 12: "item_rows"},
    "max_candidates",
    frozenset({10}),
    varint=frozenset({12}),
)
RECOMMEND = Shape("RecommendRequest", {2: "history entries"}, "max_history")
# A signal has embedding_dim values (a few dozen), checked once parsed; on the bytes it is bounded
# like a Select's candidates, or 16 MB of packed varints would build 16M entries (≈ +370 MB).
MULTISELECT = Shape(
    "MultiSelectRequest", {3: "signal", 7: "lattice_signal"}, "max_candidates", frozenset({3}), varint=frozenset({7})
)
BATCH = Shape("SelectBatchRequest", {1: "requests"}, "max_batch", items=SELECT, total="max_batch_candidates")


def _malformed(shape: Shape) -> Refused:
    return Refused(
        f"the request is not a valid recsvc.v1.{shape.name} (malformed protobuf wire format, or a "
        f"compressed message: this server never decompresses requests); expected an uncompressed "
        f"serialized {shape.name} (proto/recsvc/v1/selection.proto)"
    )


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


def _too_many(shape: Shape, number: int, limit: int) -> Refused:
    return Refused(
        f"more than {limit} {shape.counted[number]} in one {shape.name}; this server accepts at most {limit}"
    )


def check(data: bytes, shape: Shape, limits: Limits, pos: int = 0, end: int | None = None) -> int:
    """Raises :class:`Refused` if data[pos:end] has more entries in a counted field (or more
    fields) than the limits allow, or is not well-formed wire format at its top level; returns the
    number of fields it walked (0: the message is too small to pass a limit)."""
    end = len(data) if end is None else end
    limit = getattr(limits, shape.limit)
    if shape.items is None and end - pos <= (1 if shape.varint else 2) * limit:
        return 0  # every entry takes ≥ 2 bytes (≥ 1 packed varint): no count can pass the limit
    counts = dict.fromkeys(shape.counted, 0)
    most = len(counts) * limit + EXTRA_FIELDS
    total = 0
    try:
        for number, wire_type, start, stop in fields(data, pos, end):
            total += 1
            if total > most:
                raise Refused(
                    f"more than {most} fields in one {shape.name}; this server accepts at most "
                    f"{limit} {'/'.join(shape.counted.values())} per {shape.name}"
                )
            if number not in counts:
                continue
            if wire_type == 2 and number in shape.fixed64:
                counts[number] += (stop - start + 7) // 8
            elif wire_type == 2 and number in shape.varint:  # C-speed count, on at most 10 × limit bytes
                run = min(stop - start, 10 * limit + 10)
                counts[number] += len(data[start : start + run].translate(None, _HIGH))
            else:
                counts[number] += 1
            if counts[number] > limit:
                raise _too_many(shape, number, limit)
    except Refused:
        raise
    except (IndexError, ValueError):
        raise _malformed(shape) from None
    return total


def decoder(message_type: Callable[..., M], shape: Shape, limits: Limits) -> Callable[[bytes], M]:
    """A request deserializer: the bounded pre-scan, then the protobuf parser (for a batch, one
    item at a time, :func:`_parse_items`)."""

    def decode(data: bytes) -> M:
        check(data, shape, limits)
        try:
            if shape.items is not None:
                return _parse_items(message_type(), data, shape, limits)
            return message_type.FromString(data)  # type: ignore[attr-defined]  # a generated message class; Callable hides FromString
        except DecodeError:
            raise _malformed(shape) from None

    return decode


def _parse_items(message: Any, data: bytes, shape: Shape, limits: Limits) -> Any:
    """``message`` (a batch: ``shape.items`` set) parsed from ``data``, whose top level
    :func:`check` has passed; :class:`Refused` when an item passes its limits or the items'
    candidates (each its most entries of one counted field) pass ``shape.total`` in all.

    A message of at most :data:`WHOLE_BATCH` bytes is parsed at once, then its items are counted.
    A larger one is merged field by field (merging a message's fields in order is parsing it) and
    refused at the first item past a limit, so it never builds more than ``shape.total`` entries
    and one item. An item over :data:`SCANNED_ITEM` × its limit bytes is scanned before it is
    parsed, and the fields the scan walked count toward the total as candidates do, so the scans of
    one batch walk a bounded number of fields in Python too."""
    assert shape.items is not None and shape.total is not None
    inner = shape.items
    limit, most = getattr(limits, inner.limit), getattr(limits, shape.total)
    ((number, label),) = shape.counted.items()
    item_field = message.DESCRIPTOR.fields_by_number[number]
    numbers = list(inner.counted)
    names = [item_field.message_type.fields_by_number[n].name for n in numbers]
    items = getattr(message, item_field.name)

    def add(total: int, i: int, item: Any, walked: int = 0) -> int:
        """``total`` plus item ``i``'s candidates, or :class:`Refused`."""
        counts = [len(getattr(item, name)) for name in names]
        largest = max(counts)
        if largest > limit:
            raise Refused(f"{label}[{i}]: {_too_many(inner, numbers[counts.index(largest)], limit)}")
        total += max(walked, largest)
        if total > most:
            raise Refused(
                f"more than {most} candidates in all the {label} of one {shape.name} (a request's candidates: "
                f"the most of its {', '.join(names)}); this server accepts at most {most} per batch: send "
                "fewer or smaller requests in each batch"
            )
        return total

    if len(data) <= WHOLE_BATCH:
        message.MergeFromString(data)
        total = 0
        for i, item in enumerate(items):
            total = add(total, i, item)
        return message
    view, total, begin = memoryview(data), 0, 0
    for n, wire_type, start, stop in fields(data, 0, len(data)):
        if n != number or wire_type != 2:
            message.MergeFromString(view[begin:stop])
        else:
            walked = 0
            if stop - start > SCANNED_ITEM * limit:
                try:
                    walked = check(data, inner, limits, start, stop)
                except Refused as exc:
                    raise Refused(f"{label}[{len(items)}]: {exc}") from None
            item = items.add()
            item.MergeFromString(view[start:stop])
            total = add(total, len(items) - 1, item, walked)
        begin = stop
    return message


# -- message codecs ----------------------------------------------------------------------------


def candidates(req: pb.SelectRequest) -> tuple[Sequence[str] | None, np.ndarray, np.ndarray | None]:
    """(item_ids, raw scores, rows) from any one encoding of the candidates: ids or rows is None."""
    if len(req.item_rows):
        if len(req.candidates) or len(req.item_ids):
            other = "candidates" if len(req.candidates) else "item_ids"
            raise InvalidRequest(
                f"both item_rows and {other} are set; expected exactly one encoding of the candidates "
                "(item_rows + scores + catalog_version, item_ids + scores, or candidates)"
            )
        raw, rows = np.array(req.scores, dtype=np.float64), np.array(req.item_rows, dtype=np.int64)
        if rows.size != raw.size:
            raise InvalidRequest(
                f"item_rows has {rows.size} entries but scores has {raw.size}; expected one score per row"
            )
        return None, raw, rows
    if len(req.item_ids) or len(req.scores):
        if len(req.candidates):
            raise InvalidRequest("both candidates and item_ids/scores are set; expected exactly one encoding")
        ids, raw = req.item_ids, np.array(req.scores, dtype=np.float64)
        if len(ids) != raw.size:
            raise InvalidRequest(
                f"item_ids has {len(ids)} entries but scores has {raw.size}; expected one score per item_id"
            )
        return ids, raw, None
    cands = list(req.candidates)  # one wrapper per candidate: the slower encoding
    return [c.item_id for c in cands], np.array([c.score for c in cands], dtype=np.float64), None


_HASH_PIECE = 2000  # bytes; hashlib releases the GIL for updates of 2048 bytes or more


def fingerprint(kind: bytes, req: Any) -> bytes:
    """SHA-256 of the canonical request (the ledger stores only HMAC(server key, this digest),
    see recsvc.ledger.fingerprint). Fed in pieces below hashlib's 2 KiB GIL-release
    threshold: releasing the GIL for a few µs of hashing only wakes a waiting thread for nothing."""
    h = hashlib.sha256(kind)
    data = memoryview(req.SerializeToString(deterministic=True))
    for i in range(0, len(data), _HASH_PIECE):
        h.update(data[i : i + _HASH_PIECE])
    return h.digest()


def params(req: Any) -> dict[str, float | None]:
    """The request's mechanism parameters (None: the mechanism's default); every registered
    parameter that the message has a field for."""
    return {name: getattr(req, name) if req.HasField(name) else None for name in _param_fields(req.DESCRIPTOR)}


@functools.cache
def _param_fields(descriptor: Any) -> tuple[str, ...]:
    """The registered parameters a message type has a field for, in registry order (once per type)."""
    return tuple(name for name in PARAM_NAMES if name in descriptor.fields_by_name)


def select_input(req: pb.SelectRequest) -> tuple[SelectInput, np.ndarray, np.ndarray | None]:
    """A Select request for the selector: its input, raw scores and rows (None unless sent as rows)."""
    ids, raw, rows = candidates(req)
    x = SelectInput(
        req.user_id,
        req.request_id,
        req.mechanism,
        req.epsilon,
        params(req),
        lambda: fingerprint(b"select\0", req),
        req.k,
        ids,
        req.catalog_version,
    )
    return x, raw, rows


def recommend_input(req: pb.RecommendRequest) -> dict[str, Any]:
    """A Recommend request as the arguments of :meth:`recsvc.service.selection.Selector.prepare_recommend`."""
    fraction = req.candidate_fraction if req.HasField("candidate_fraction") else None
    return dict(
        user_id=req.user_id,
        request_id=req.request_id,
        mechanism=req.mechanism,
        epsilon=req.epsilon,
        params=params(req),
        history=req.history,
        num_candidates=req.num_candidates,
        fingerprint=lambda: fingerprint(b"recommend\0", req),
        k=req.k,
        candidate_fraction=fraction,
        candidate_mechanism=req.candidate_mechanism,
    )


def multiselect_input(req: pb.MultiSelectRequest) -> dict[str, Any]:
    """A MultiSelect request as the arguments of :meth:`recsvc.service.multiselect.MultiSelector.prepare`."""
    return dict(
        user_id=req.user_id,
        request_id=req.request_id,
        signal=np.array(req.lattice_signal, dtype=np.int64),
        float_values=len(req.signal),
        grid_step=req.grid_step,
        embedding_version=req.embedding_version,
        k=req.k,
        epsilon=req.epsilon,
        fingerprint=lambda: fingerprint(b"multiselect\0", req),
        code=req.code,
        codebook_version=req.codebook_version,
    )


def multiselect_message(a: MultiAnswer) -> pb.MultiSelectResponse:
    return pb.MultiSelectResponse(**asdict(a))  # a MultiAnswer's fields are the message's, by name


def select_response(s: Selected) -> pb.SelectResponse:
    """The SelectResponse of a charged request, from its typed answer: a replay is the first
    answer, field for field, with ``replayed`` set."""
    a = s.answer
    return pb.SelectResponse(
        item_id=a.item_ids[0],
        item_ids=a.item_ids,
        item_rows=a.item_rows,
        mechanism=a.mechanism,
        epsilon_spent=a.epsilon,
        budget_remaining=a.remaining,
        request_id=s.request_id,
        replayed=s.replayed,
    )


def mechanisms_response(
    selector: Selector, config: SelectorConfig, budget: float, multi: MultiSelector | None = None
) -> pb.ListMechanismsResponse:
    """The server's public configuration: mechanisms, the ``auto`` table, the limits and the
    multi-selection embedding (empty version: MultiSelect is unavailable)."""
    infos = [
        pb.MechanismInfo(
            name=name, private=bool(m.private), allowed=bool(m.private) or config.selection.allow_non_private
        )
        for name, m in sorted(MECHANISMS.items())
    ]
    table = selector.auto_table
    auto = (
        []
        if table is None
        else [pb.AutoPolicyEntry(epsilon=e, k=k, mechanism=m, expected_mse=v) for k, e, m, v in table.winners()]
    )
    return pb.ListMechanismsResponse(
        mechanisms=infos,
        auto_policy=auto,
        default_mechanism=selector.default_mechanism,
        auto_resolves_to=selector.auto_choice or "",
        auto_threshold=config.selection.auto_threshold,
        population_spearman_median=float("nan") if selector.rho_median is None else selector.rho_median,
        budget=budget,
        max_candidates=config.limits.max_candidates,
        max_slate=config.limits.max_slate,
        min_candidates=config.limits.min_candidates,
        catalog_size=len(selector.catalog.item_ids) if selector.recommender is not None else 0,
        catalog_version=selector.catalog.version,
        embedding_version=multi.version if multi is not None else "",
        embedding_dim=multi.dim if multi is not None else 0,
        embedding_radius=multi.radius if multi is not None else 0.0,
        embedding_grid_step=multi.lattice.step if multi is not None else 0.0,
        embedding_lattice_radius=multi.lattice.radius if multi is not None else 0,
        codebook_version=multi.codebook_version if multi is not None else "",
        code_size=multi.code_size if multi is not None else 0,
        max_multiselect_k=multi.max_k if multi is not None else 0,
        default_candidate_mechanism=config.selection.default_candidate_mechanism,
    )


@dataclass(frozen=True, slots=True)
class Framed:
    """An answer already serialized (SelectBatch's), with what each item came to for the metrics:
    (mechanism, status name, ε charged, replayed) per item; a refused item has mechanism ""."""

    data: bytes
    outcomes: list[tuple[str, str, float, bool]]


def serializer(message_type: Any) -> Callable[[Any], bytes]:
    """Serializes a response message; a :class:`Framed` answer is sent as it is."""

    def serialize(response: Any) -> bytes:
        return response.data if isinstance(response, Framed) else message_type.SerializeToString(response)

    return serialize
