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
from recsvc.service import metrics
from recsvc.service.config import Policy
from recsvc.service.ledger import BudgetExceeded, Ledger, RequestConflict
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
    return pb.SelectResponse(item_id=s.item_id, mechanism=s.mechanism, epsilon_spent=s.epsilon,
                             budget_remaining=s.budget_remaining, request_id=s.request_id).SerializeToString()


T = TypeVar("T")


class SelectionServicer(pb_grpc.PrivateSelectionServicer):
    def __init__(self, artifact: Artifact, ledger: Ledger | None, policy: Policy) -> None:
        self.selector = Selector(artifact, policy)
        self.policy = policy
        self._ledger = ledger  # the server attaches it only after every startup check

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

    def prepare_select(self, req: pb.SelectRequest) -> Prepared:
        item_ids, raw = _candidate_columns(req)
        return self.selector.prepare_select(req.user_id, req.request_id, req.mechanism, req.epsilon, _params(req),
                                            item_ids, raw, lambda: _fingerprint(b"select\0", req))

    def prepare_recommend(self, req: pb.RecommendRequest) -> Prepared:
        return self.selector.prepare_recommend(req.user_id, req.request_id, req.mechanism, req.epsilon,
                                               _params(req), req.history, req.num_candidates,
                                               lambda: _fingerprint(b"recommend\0", req))

    def execute(self, p: Prepared) -> pb.SelectResponse:
        charge = self.selector.execute(self.ledger, p, _encode)
        if charge.replayed:
            metrics.REPLAYS.inc()
            resp = pb.SelectResponse.FromString(charge.response)
            resp.replayed = True
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

    def Select(self, request: pb.SelectRequest, context: grpc.ServicerContext) -> pb.SelectResponse:
        return self._call("Select", context, lambda: self.execute(self.prepare_select(request)),
                          lambda r: r.mechanism)

    def Recommend(self, request: pb.RecommendRequest, context: grpc.ServicerContext) -> pb.SelectResponse:
        return self._call("Recommend", context, lambda: self.execute(self.prepare_recommend(request)),
                          lambda r: r.mechanism)

    def SelectBatch(self, request: pb.SelectBatchRequest, context: grpc.ServicerContext) -> pb.SelectBatchResponse:
        def run() -> pb.SelectBatchResponse:
            if len(request.requests) > self.policy.max_batch:
                raise InvalidRequest(
                    f"{len(request.requests)} requests in one batch is too many; expected at most {self.policy.max_batch}"
                )
            return pb.SelectBatchResponse(results=list(self._batch_items(request.requests)))

        return self._call("SelectBatch", context, run)

    def _batch_items(self, requests: Iterable[pb.SelectRequest]) -> Iterable[pb.SelectResult]:
        for req in requests:  # each item is its own transaction: partial failures are per item
            try:
                resp = self.execute(self.prepare_select(req))
            except Exception as exc:  # noqa: BLE001
                code, message = status_of(exc)
                if code is grpc.StatusCode.INTERNAL:
                    log_internal_error("SelectBatch item", exc)
                metrics.requests("SelectBatch.item", "", code.name).inc()
                yield pb.SelectResult(error=pb.Error(code=code.value[0], code_name=code.name, message=message))
            else:
                metrics.requests("SelectBatch.item", resp.mechanism, "OK").inc()
                yield pb.SelectResult(response=resp)

    def GetBudget(self, request: pb.GetBudgetRequest, context: grpc.ServicerContext) -> pb.GetBudgetResponse:
        def run() -> pb.GetBudgetResponse:
            check_id("user_id", request.user_id, required=True)
            u = self.ledger.user(request.user_id)
            return pb.GetBudgetResponse(user_id=u.user_id, budget=u.budget, spent=u.spent,
                                        remaining=u.remaining, requests=u.requests)

        return self._call("GetBudget", context, run)

    def ListMechanisms(self, request: pb.ListMechanismsRequest, context: grpc.ServicerContext) -> pb.ListMechanismsResponse:
        def run() -> pb.ListMechanismsResponse:
            infos = [
                pb.MechanismInfo(name=name, private=bool(m.private),
                                 allowed=bool(m.private) or self.policy.allow_non_private)
                for name, m in sorted(MECHANISMS.items())
            ]
            return pb.ListMechanismsResponse(
                mechanisms=infos,
                default_mechanism=self.default_mechanism,
                auto_resolves_to=self.auto_choice or "",
                auto_threshold=self.policy.auto_threshold,
                population_spearman_median=float("nan") if self.selector.rho_median is None else self.selector.rho_median,
                budget=self.ledger.budget,
                max_candidates=self.policy.max_candidates,
            )

        return self._call("ListMechanisms", context, run)


def log_internal_error(what: str, exc: BaseException) -> None:
    """Logs an unexpected failure by type and stack only: an exception's message (e.g. one of
    numpy's) may quote the values it was given, and those may be a user's scores."""
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("%s failed with an internal error: %s (message withheld)\n%s", what, type(exc).__name__, stack)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for a refusal. Messages are ours (no score values), except ValueErrors
    from the mechanisms, which validate the same inputs we already checked."""
    if isinstance(exc, BudgetExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, RequestConflict):
        return grpc.StatusCode.ALREADY_EXISTS, str(exc)
    if isinstance(exc, Unavailable):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"
