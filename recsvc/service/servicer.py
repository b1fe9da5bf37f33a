"""The PrivateSelection servicer: converts messages and maps refusals to status codes.

All selection logic (checks, clipping, ``auto``, the ledger transaction) lives in the
proto-free :mod:`recsvc.service.selection`; this module only speaks gRPC.
"""

from __future__ import annotations

import hashlib
import logging
import time
import traceback
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
from recsvc.service.ledger_base import BudgetExceeded, Charge, LedgerStore, LedgerUnavailable, RequestConflict
from recsvc.service.selection import InvalidRequest, Prepared, Selected, Selector, Unavailable, check_id
from recsvc.v1 import selection_pb2 as pb
from recsvc.v1 import selection_pb2_grpc as pb_grpc

log = logging.getLogger("recsvc.service")


def _candidate_columns(req: pb.SelectRequest) -> tuple[Sequence[str], np.ndarray]:
    """(item_ids, raw scores) from either encoding of the candidates."""
    if len(req.item_ids) or len(req.scores):
        if len(req.candidates):
            raise InvalidRequest("both candidates and item_ids/scores are set; expected exactly one encoding")
        ids, raw = req.item_ids, np.array(req.scores, dtype=np.float64)
        if len(ids) != raw.size:
            raise InvalidRequest(
                f"item_ids has {len(ids)} entries but scores has {raw.size}; expected one score per item_id"
            )
        return ids, raw
    cands = list(req.candidates)  # one wrapper per candidate: the slower encoding
    return [c.item_id for c in cands], np.array([c.score for c in cands], dtype=np.float64)


_HASH_PIECE = 2000  # bytes; hashlib releases the GIL for updates of 2048 bytes or more


def _fingerprint(kind: bytes, req: Any) -> bytes:
    """SHA-256 of the canonical request (the ledger stores only HMAC(server key, this digest),
    see recsvc.service.fingerprint_key). Fed in pieces below hashlib's 2 KiB GIL-release
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
    return pb.SelectResponse(item_id=s.item_id, item_ids=s.item_ids, mechanism=s.mechanism, epsilon_spent=s.epsilon,
                             budget_remaining=s.budget_remaining, request_id=s.request_id).SerializeToString()


T = TypeVar("T")


class SelectionServicer(pb_grpc.PrivateSelectionServicer):
    def __init__(self, artifact: Artifact, ledger: LedgerStore | None, policy: Policy) -> None:
        self.selector = Selector(artifact, policy)
        self.policy = policy
        self._ledger = ledger  # the server attaches it only after every startup check
        self.limiter: RateLimiter | None = None  # the gate's; SelectBatch pays for its items here

    @property
    def ledger(self) -> LedgerStore:
        if self._ledger is None:
            raise RuntimeError("the servicer has no ledger attached yet")
        return self._ledger

    @ledger.setter
    def ledger(self, ledger: LedgerStore) -> None:
        self._ledger = ledger

    @property
    def default_mechanism(self) -> str:
        return self.selector.default_mechanism

    @property
    def auto_choice(self) -> str | None:
        return self.selector.auto_choice

    def prepare_select(self, req: pb.SelectRequest) -> Prepared:
        item_ids, raw = _candidate_columns(req)
        return self.selector.prepare_select(req.user_id, req.request_id, req.mechanism, req.epsilon, _params(req),
                                            item_ids, raw, lambda: _fingerprint(b"select\0", req), k=req.k)

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

    def SelectBatch(self, request: pb.SelectBatchRequest, context: grpc.ServicerContext) -> pb.SelectBatchResponse:
        def run() -> pb.SelectBatchResponse:
            caller = current_caller()  # the batch's size was checked before parsing (wire.BATCH)
            if self.limiter is not None and len(request.requests) > 1:  # the rate limit counts every item
                self.limiter.debit(caller.key, len(request.requests) - 1)
            return pb.SelectBatchResponse(results=list(self._batch_items(caller, request.requests)))

        return self._call("SelectBatch", context, run)

    def _batch_items(self, caller: Caller, requests: Sequence[pb.SelectRequest]) -> Iterable[pb.SelectResult]:
        """Each item is checked alone (a refusal is that item's error and spends nothing); the
        rest are drawn vectorised and charged in ONE ledger transaction (recsvc.service.batch)."""
        outcomes: list[Any] = [None] * len(requests)
        prepared: dict[int, Prepared] = {}
        for i, req in enumerate(requests):
            try:
                caller.check_user(req.user_id)  # an item for a user_id outside the scope is refused alone
                prepared[i] = self.prepare_select(req)
            except Exception as exc:  # noqa: BLE001
                outcomes[i] = exc
        if prepared:
            charged = execute_batch(self.selector, self.ledger, list(prepared.values()), _encode)
            for (i, p), charge in zip(prepared.items(), charged):
                outcomes[i] = charge if isinstance(charge, Exception) else self._response(p, charge)
        denied = 0
        for out in outcomes:
            if isinstance(out, Exception):
                denied += isinstance(out, PermissionDenied)
                code, message = status_of(out)
                if code is grpc.StatusCode.INTERNAL:
                    log_internal_error("SelectBatch item", out)
                metrics.requests("SelectBatch.item", "", code.name).inc()
                yield pb.SelectResult(error=pb.Error(code=code.value[0], code_name=code.name, message=message))
            else:
                metrics.requests("SelectBatch.item", out.mechanism, "OK").inc()
                yield pb.SelectResult(response=out)
        if denied:  # one line per batch, with the principal and never the request
            log.warning("PERMISSION_DENIED SelectBatch: %d item(s) for principal %s: another user_id", denied, caller)

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
                                                  response_serializer=response.SerializeToString)
        for name, (fn, decode, response) in methods.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


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
