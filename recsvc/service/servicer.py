"""The PrivateSelection servicer: converts messages and maps refusals to status codes.

All selection logic (checks, clipping, ``auto``, the ledger transaction) lives in the
proto-free :mod:`recsvc.service.selection`; this module only speaks gRPC.
"""

from __future__ import annotations

import hashlib
import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import grpc
import numpy as np

from recsvc.artifact import Artifact
from recsvc.mechanisms import MECHANISMS, PARAM_NAMES
from recsvc.service import metrics, wire
from recsvc.service.auth import SERVICE_NAME, Caller, PermissionDenied
from recsvc.service.config import Policy
from recsvc.service.gate import RateLimiter, current_caller
from recsvc.service.batch import execute_batch
from recsvc.ledger import BudgetExceeded, Charge, Ledger, LedgerUnavailable, RequestConflict
from recsvc.service.selection import (Columns, InvalidRequest, Prepared, Selected, SelectInput, Selector,
                                      Unavailable, check_id)
from recsvc.v1 import selection_pb2 as pb
from recsvc.v1 import selection_pb2_grpc as pb_grpc

log = logging.getLogger("recsvc.service")


def _candidates(req: pb.SelectRequest) -> tuple[Sequence[str] | None, np.ndarray, np.ndarray | None]:
    """(item_ids, raw scores, rows) from any one encoding of the candidates: ids or rows is None."""
    if len(req.item_rows):
        if len(req.candidates) or len(req.item_ids):
            other = "candidates" if len(req.candidates) else "item_ids"
            raise InvalidRequest(f"both item_rows and {other} are set; expected exactly one encoding of the candidates "
                                 "(item_rows + scores + catalog_version, item_ids + scores, or candidates)")
        raw, rows = np.array(req.scores, dtype=np.float64), np.array(req.item_rows, dtype=np.int64)
        if rows.size != raw.size:
            raise InvalidRequest(f"item_rows has {rows.size} entries but scores has {raw.size}; "
                                 "expected one score per row")
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


def _fingerprint(kind: bytes, req: Any) -> bytes:
    """SHA-256 of the canonical request (the ledger stores only HMAC(server key, this digest),
    see recsvc.ledger.fingerprint). Fed in pieces below hashlib's 2 KiB GIL-release
    threshold: releasing the GIL for a few µs of hashing only wakes a waiting thread for nothing."""
    h = hashlib.sha256(kind)
    data = memoryview(req.SerializeToString(deterministic=True))
    for i in range(0, len(data), _HASH_PIECE):
        h.update(data[i:i + _HASH_PIECE])
    return h.digest()


def _params(req: Any) -> dict[str, float | None]:
    """The request's mechanism parameters (None: the mechanism's default); every registered
    parameter that the message has a field for."""
    fields = req.DESCRIPTOR.fields_by_name
    return {name: getattr(req, name) if req.HasField(name) else None for name in PARAM_NAMES if name in fields}


def _encode(s: Selected) -> bytes:
    return pb.SelectResponse(item_id=s.item_id, item_ids=s.item_ids, item_rows=s.item_rows, mechanism=s.mechanism,
                             epsilon_spent=s.epsilon, budget_remaining=s.budget_remaining,
                             request_id=s.request_id).SerializeToString()


T = TypeVar("T")


class SelectionServicer(pb_grpc.PrivateSelectionServicer):
    def __init__(self, artifact: Artifact, ledger: Ledger | None, policy: Policy) -> None:
        self.selector = Selector(artifact, policy)
        self.policy = policy
        self._ledger = ledger  # the server attaches it only after every startup check
        self.limiter: RateLimiter | None = None  # the gate's; SelectBatch pays for its items here

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError("the servicer has no ledger attached yet")
        return self._ledger

    @ledger.setter
    def ledger(self, ledger: Ledger) -> None:
        self._ledger = ledger

    @property
    def default_mechanism(self) -> str:
        return self.selector.default_mechanism

    @property
    def auto_choice(self) -> str | None:
        return self.selector.auto_choice

    def prepare_selects(self, requests: Sequence[pb.SelectRequest]) -> list[Prepared | Exception]:
        """Each request's Prepared or refusal (a single Select is a batch of one): every request's
        columns decoded, then checked and clipped together (Selector.prepare_many)."""
        out: list[Prepared | Exception | None] = [None] * len(requests)
        inputs, raws, rows, where = [], [], [], []
        for i, req in enumerate(requests):
            try:
                ids, raw, r = _candidates(req)
            except Exception as exc:  # noqa: BLE001 - this request alone is refused
                out[i] = exc
                continue
            inputs.append(SelectInput(req.user_id, req.request_id, req.mechanism, req.epsilon, _params(req),
                                      lambda req=req: _fingerprint(b"select\0", req), req.k, ids, req.catalog_version))
            raws.append(raw)
            where.append(i)
            if r is not None:
                rows.append(r)
        for i, p in zip(where, self.selector.prepare_many(inputs, Columns.of(raws, rows))):
            out[i] = p
        return out  # type: ignore[return-value]

    def prepare_select(self, req: pb.SelectRequest) -> Prepared:
        out = self.prepare_selects([req])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def prepare_recommend(self, req: pb.RecommendRequest) -> Prepared:
        return self.selector.prepare_recommend(req.user_id, req.request_id, req.mechanism, req.epsilon,
                                               _params(req), req.history, req.num_candidates,
                                               lambda: _fingerprint(b"recommend\0", req), k=req.k,
                                               candidate_fraction=req.candidate_fraction
                                               if req.HasField("candidate_fraction") else None)

    def execute(self, p: Prepared) -> pb.SelectResponse:
        return self._response(p, self.selector.execute(self.ledger, p, _encode))

    @staticmethod
    def _response(p: Prepared, charge: Charge) -> pb.SelectResponse:
        """The response to send (replays marked); counts the ε of a fresh charge (SelectBatch counts its own)."""
        if charge.replayed:
            metrics.REPLAYS.inc()
            resp = pb.SelectResponse.FromString(charge.response)
            resp.replayed = True
            if not resp.item_ids:  # stored before slates existed: its one item is the slate
                resp.item_ids.append(resp.item_id)
            return resp
        metrics.epsilon_spent(p.mechanism).inc(p.epsilon)
        return pb.SelectResponse.FromString(charge.response)

    # -- RPCs --------------------------------------------------------------------------------

    def _call(self, method: str, context: grpc.ServicerContext, fn: Callable[[], T],
              mechanism: Callable[[T], str] = lambda _: "") -> T:
        """Runs one RPC body: maps refusals to status codes, records metrics, logs no scores."""
        t0 = time.perf_counter()
        code, mech = grpc.StatusCode.OK, ""
        try:
            result = fn()
            mech = mechanism(result)
            return result
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status code
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log_internal_error(method, exc)
            context.abort(code, message)
            raise AssertionError("unreachable")  # context.abort raises
        finally:
            elapsed = time.perf_counter() - t0
            metrics.requests(method, mech, code.name).inc()
            metrics.latency(method).observe(elapsed)
            if log.isEnabledFor(logging.DEBUG):  # no formatting work unless asked for
                log.debug("%s %s mechanism=%s %.2fms", method, code.name, mech or "-", elapsed * 1e3)

    @staticmethod
    def authorize(method: str, user_id: str) -> None:
        """PERMISSION_DENIED (logged with the principal, never the request) unless the caller's
        scope covers ``user_id``; runs before any check, so an out-of-scope call costs nothing."""
        caller = current_caller()
        try:
            caller.check_user(user_id)
        except PermissionDenied:
            log.warning("PERMISSION_DENIED %s for principal %s: another user_id", method, caller)
            raise

    def Select(self, request: pb.SelectRequest, context: grpc.ServicerContext) -> pb.SelectResponse:
        def run() -> pb.SelectResponse:
            self.authorize("Select", request.user_id)
            return self.execute(self.prepare_select(request))

        return self._call("Select", context, run, lambda r: r.mechanism)

    def Recommend(self, request: pb.RecommendRequest, context: grpc.ServicerContext) -> pb.SelectResponse:
        def run() -> pb.SelectResponse:
            self.authorize("Recommend", request.user_id)
            return self.execute(self.prepare_recommend(request))

        return self._call("Recommend", context, run, lambda r: r.mechanism)

    def SelectBatch(self, request: pb.SelectBatchRequest, context: grpc.ServicerContext) -> bytes:
        """Answers with the serialized SelectBatchResponse (see :func:`batch_response`)."""
        def run() -> bytes:
            caller = current_caller()  # the batch's size was checked before parsing (wire.BATCH)
            if self.limiter is not None and len(request.requests) > 1:  # the rate limit counts every item
                self.limiter.debit(caller.key, len(request.requests) - 1)
            return batch_response(self._batch_items(caller, request.requests))

        return self._call("SelectBatch", context, run)

    def _batch_items(self, caller: Caller, requests: Sequence[pb.SelectRequest]) -> list[tuple[int, bytes]]:
        """Each item is checked alone (a refusal is that item's error and spends nothing); the
        rest are drawn vectorised and charged in ONE ledger transaction (recsvc.service.batch).
        Returns each item's SelectResult field: (1, SelectResponse bytes) or (2, Error bytes)."""
        outcomes: list[Any] = [None] * len(requests)
        allowed: list[int] = []
        for i, req in enumerate(requests):
            try:
                caller.check_user(req.user_id)  # an item for a user_id outside the scope is refused alone
                allowed.append(i)
            except PermissionDenied as exc:
                outcomes[i] = exc
        prepared: dict[int, Prepared] = {}
        for i, p in zip(allowed, self.prepare_selects([requests[i] for i in allowed])):
            if isinstance(p, Exception):
                outcomes[i] = p
            else:
                prepared[i] = p
        if prepared:
            charged = execute_batch(self.selector, self.ledger, list(prepared.values()), _encode)
            for (i, p), charge in zip(prepared.items(), charged):
                outcomes[i] = (p, charge)
        counts: Counter[tuple[str, str]] = Counter()
        spent: Counter[str] = Counter()
        results: list[tuple[int, bytes]] = []
        denied = 0
        for out in outcomes:
            if isinstance(out, tuple) and not isinstance(out[1], Exception):
                p, charge = out
                if charge.replayed:  # rare: parsed to mark it replayed (and fill an old answer's item_ids)
                    resp = self._response(p, charge)
                    counts[resp.mechanism, "OK"] += 1
                    results.append((1, resp.SerializeToString()))
                else:  # the stored answer's bytes are the response: no parse, no re-encode
                    counts[p.mechanism, "OK"] += 1
                    spent[p.mechanism] += p.epsilon
                    results.append((1, charge.response))
                continue
            exc = out[1] if isinstance(out, tuple) else out
            denied += isinstance(exc, PermissionDenied)
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log_internal_error("SelectBatch item", exc)
            counts["", code.name] += 1
            results.append((2, pb.Error(code=code.value[0], code_name=code.name, message=message).SerializeToString()))
        for (mech, code_name), n in counts.items():
            metrics.requests("SelectBatch.item", mech, code_name).inc(n)
        for mech, eps in spent.items():
            metrics.epsilon_spent(mech).inc(eps)
        if denied:  # one line per batch, with the principal and never the request
            log.warning("PERMISSION_DENIED SelectBatch: %d item(s) for principal %s: another user_id", denied, caller)
        return results

    def GetBudget(self, request: pb.GetBudgetRequest, context: grpc.ServicerContext) -> pb.GetBudgetResponse:
        def run() -> pb.GetBudgetResponse:
            self.authorize("GetBudget", request.user_id)
            check_id("user_id", request.user_id, required=True)
            u = self.ledger.user(request.user_id)
            return pb.GetBudgetResponse(user_id=u.user_id, budget=u.budget, spent=u.spent,
                                        remaining=u.remaining, requests=u.requests,
                                        window_start_unix=u.window_start, window_end_unix=u.window_end)

        return self._call("GetBudget", context, run)

    def ListMechanisms(self, request: pb.ListMechanismsRequest, context: grpc.ServicerContext) -> pb.ListMechanismsResponse:
        def run() -> pb.ListMechanismsResponse:
            infos = [
                pb.MechanismInfo(name=name, private=bool(m.private),
                                 allowed=bool(m.private) or self.policy.allow_non_private)
                for name, m in sorted(MECHANISMS.items())
            ]
            table = self.selector.auto_table
            policy = [] if table is None else [
                pb.AutoPolicyEntry(epsilon=e, k=k, mechanism=m, expected_mse=v) for k, e, m, v in table.winners()
            ]
            return pb.ListMechanismsResponse(
                mechanisms=infos,
                auto_policy=policy,
                default_mechanism=self.default_mechanism,
                auto_resolves_to=self.auto_choice or "",
                auto_threshold=self.policy.auto_threshold,
                population_spearman_median=float("nan") if self.selector.rho_median is None else self.selector.rho_median,
                budget=self.ledger.budget,
                max_candidates=self.policy.max_candidates,
                max_slate=self.policy.max_slate,
                min_candidates=self.policy.min_candidates,
                catalog_size=len(self.selector.catalog.item_ids) if self.selector.recommender is not None else 0,
                catalog_version=self.selector.catalog.version,
            )

        return self._call("ListMechanisms", context, run)


def register(servicer: SelectionServicer, server: grpc.Server) -> None:
    """Adds the service to ``server`` with request decoders that enforce the size limits on the
    raw bytes before parsing (:mod:`recsvc.service.wire`); the gate runs them after authentication."""
    limits = wire.Limits.of(servicer.policy)
    methods: dict[str, tuple[Callable[..., Any], Callable[[bytes], Any], Any]] = {
        "Select": (servicer.Select, wire.decoder(pb.SelectRequest, wire.SELECT, limits), pb.SelectResponse),
        "SelectBatch": (servicer.SelectBatch, wire.decoder(pb.SelectBatchRequest, wire.BATCH, limits),
                        pb.SelectBatchResponse),
        "Recommend": (servicer.Recommend, wire.decoder(pb.RecommendRequest, wire.RECOMMEND, limits), pb.SelectResponse),
        "GetBudget": (servicer.GetBudget, pb.GetBudgetRequest.FromString, pb.GetBudgetResponse),
        "ListMechanisms": (servicer.ListMechanisms, pb.ListMechanismsRequest.FromString, pb.ListMechanismsResponse),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=decode,
                                                  response_serializer=_serializer(response))
        for name, (fn, decode, response) in methods.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


def _serializer(message_type: Any) -> Callable[[Any], bytes]:
    """Serializes a response message; bytes (SelectBatch's pre-encoded answer) pass through."""
    def serialize(response: Any) -> bytes:
        return response if isinstance(response, bytes) else message_type.SerializeToString(response)

    return serialize


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def batch_response(results: Iterable[tuple[int, bytes]]) -> bytes:
    """A serialized SelectBatchResponse from each item's SelectResult field (1: a serialized
    SelectResponse, 2: a serialized Error), written directly: the stored answers are already
    SelectResponse bytes, so they are framed (tag, length) rather than parsed and re-encoded."""
    parts = []
    for number, body in results:
        inner = bytes([number << 3 | 2]) + _varint(len(body)) + body  # SelectResult.response / .error
        parts.append(b"\x0a" + _varint(len(inner)) + inner)  # SelectBatchResponse.results
    return b"".join(parts)


def log_internal_error(what: str, exc: BaseException) -> None:
    """Logs an unexpected failure by type and stack only: an exception's message (e.g. one of
    numpy's) may quote the values it was given, and those may be a user's scores."""
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("%s failed with an internal error: %s (message withheld)\n%s", what, type(exc).__name__, stack)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for a refusal. Messages are ours (no score values), except ValueErrors
    from the mechanisms, which validate the same inputs we already checked."""
    if isinstance(exc, PermissionDenied):
        return grpc.StatusCode.PERMISSION_DENIED, str(exc)
    if isinstance(exc, BudgetExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, RequestConflict):
        return grpc.StatusCode.ALREADY_EXISTS, str(exc)
    if isinstance(exc, LedgerUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, Unavailable):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"
