"""The PrivateSelection servicer. Each RPC reads: authorize → decode → selector → encode.

**How an RPC method is written** (one way for every method): a plain synchronous method
``Name(self, request, context)`` that returns the response message. The gate
(:mod:`recsvc.service.interceptors`) has already authenticated the caller, read the message and
decoded it, and runs the method in a request thread (or, for a lone small Select, on the event
loop until :meth:`defer` finds its work not light); a raised refusal
(:mod:`recsvc.service.errors`) becomes its status code and the metrics are recorded there. Work
whose cost grows with a request parameter (random stopping's 1/γ, a candidate stage's m) is
returned as a :class:`recsvc.service.draws.Deferred` instead, made by :meth:`execute` (or
:meth:`defer`): the request thread is free at once and the gate answers when the bounded heavy
queue has run it. The method is registered in :func:`register` with its decoder. The wire format
is :mod:`recsvc.service.codec`; every selection rule (checks, clipping, ``auto``, the ledger
transaction) is the proto-free :mod:`recsvc.service.selection`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from recsvc.artifact import Artifact
from recsvc.ledger import Ledger, WouldWait, without_waiting
from recsvc.service import codec
from recsvc.service.admission import RateLimiter
from recsvc.service.auth import SERVICE_NAME, Caller
from recsvc.service.batch import execute_batch
from recsvc.service.config import Policy
from recsvc.service.draws import Deferred, Offload, light
from recsvc.service.errors import PermissionDenied, ThrottledLog, log_internal_error
from recsvc.service.interceptors import current_caller, on_loop, status_of
from recsvc.service.multiselect import MultiSelector
from recsvc.service.requests import Columns, Prepared, check_user_id
from recsvc.service.selection import Selector
from recsvc.v1 import selection_pb2 as pb
from recsvc.v1 import selection_pb2_grpc as pb_grpc

log = logging.getLogger("recsvc.service")
T = TypeVar("T")


class SelectionServicer(pb_grpc.PrivateSelectionServicer):
    def __init__(self, artifact: Artifact, ledger: Ledger | None, policy: Policy) -> None:
        self.selector = Selector(artifact, policy)
        self.multi = MultiSelector(artifact, policy)
        self.policy = policy
        self._ledger = ledger  # the server attaches it only after every startup check
        self.limiter: RateLimiter | None = None  # the gate's; SelectBatch pays for its items here
        self.refusals = ThrottledLog()  # per principal, shared with the gate: a refused loop cannot flood the log

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

    # -- RPCs --------------------------------------------------------------------------------

    def Select(
        self, request: pb.SelectRequest, context: Any
    ) -> pb.SelectResponse | Deferred[pb.SelectResponse] | Offload[pb.SelectResponse]:
        self.authorize("Select", request.user_id)
        return self.execute(self.prepare_select(request))

    def Recommend(
        self, request: pb.RecommendRequest, context: Any
    ) -> pb.SelectResponse | Deferred[pb.SelectResponse] | Offload[pb.SelectResponse]:
        self.authorize("Recommend", request.user_id)
        return self.execute(self.prepare_recommend(request))

    def SelectBatch(
        self, request: pb.SelectBatchRequest, context: Any
    ) -> codec.Framed | Deferred[codec.Framed] | Offload[codec.Framed]:
        """The serialized SelectBatchResponse (:func:`recsvc.service.codec.batch_response`): each
        item is authorized, decoded and checked alone (a refusal is that item's Error and spends
        nothing); the rest are drawn vectorised and charged in ONE ledger transaction."""
        caller = current_caller()  # the batch's size was checked before parsing (codec.BATCH)
        if self.limiter is not None and len(request.requests) > 1:  # the rate limit counts every item
            self.limiter.debit(caller.key, len(request.requests) - 1)
        outcomes = self._authorize_items(caller, request.requests)
        allowed = [i for i, out in enumerate(outcomes) if out is None]
        prepared: dict[int, Prepared] = {}
        for i, p in zip(allowed, self.prepare_selects([request.requests[i] for i in allowed]), strict=False):
            if isinstance(p, Exception):
                outcomes[i] = p
            else:
                prepared[i] = p

        def finish() -> codec.Framed:
            if prepared:
                charged = execute_batch(self.selector, self.ledger, list(prepared.values()))
                for (i, p), charge in zip(prepared.items(), charged, strict=False):
                    outcomes[i] = (p, charge)
            return self._encode_batch(outcomes)

        return self.defer(finish, sum(p.work for p in prepared.values()))

    def MultiSelect(self, request: pb.MultiSelectRequest, context: Any) -> pb.MultiSelectResponse:
        self.authorize("MultiSelect", request.user_id)
        prepared = self.multi.prepare(**codec.multiselect_input(request))
        answer = self.multi.execute(self.ledger, prepared)
        return codec.multiselect_message(answer)

    def GetBudget(self, request: pb.GetBudgetRequest, context: Any) -> pb.GetBudgetResponse:
        self.authorize("GetBudget", request.user_id)
        check_user_id(request.user_id)
        u = self.ledger.user(request.user_id)
        return pb.GetBudgetResponse(
            user_id=u.user_id,
            budget=u.budget,
            spent=u.spent,
            remaining=u.remaining,
            requests=u.requests,
            window_start_unix=u.window_start,
            window_end_unix=u.window_end,
        )

    def ListMechanisms(self, request: pb.ListMechanismsRequest, context: Any) -> pb.ListMechanismsResponse:
        return codec.mechanisms_response(self.selector, self.policy, self.ledger.budget, self.multi)

    # -- the steps ---------------------------------------------------------------------------

    def authorize(self, method: str, user_id: str) -> None:
        """PERMISSION_DENIED (logged with the principal, never the request) unless the caller's
        scope covers ``user_id``; runs before any check, so an out-of-scope call costs nothing."""
        caller = current_caller()
        try:
            caller.check_user(user_id)
        except PermissionDenied:
            self.refusals.warning(str(caller), "PERMISSION_DENIED %s for principal %s: another user_id", method, caller)
            raise

    def prepare_selects(self, requests: Sequence[pb.SelectRequest]) -> list[Prepared | Exception]:
        """Each request's Prepared or refusal (a single Select is a batch of one): every request's
        columns decoded, then checked and clipped together (Selector.prepare_many)."""
        out: list[Prepared | Exception | None] = [None] * len(requests)
        inputs, raws, rows, where = [], [], [], []
        for i, req in enumerate(requests):
            try:
                x, raw, r = codec.select_input(req)
            except Exception as exc:
                out[i] = exc
                continue
            inputs.append(x)
            raws.append(raw)
            where.append(i)
            if r is not None:
                rows.append(r)
        for i, p in zip(where, self.selector.prepare_many(inputs, Columns.of(raws, rows)), strict=False):
            out[i] = p
        return out  # type: ignore[return-value]  # the loops above replaced every None

    def prepare_select(self, req: pb.SelectRequest) -> Prepared:
        out = self.prepare_selects([req])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def prepare_recommend(self, req: pb.RecommendRequest) -> Prepared:
        return self.selector.prepare_recommend(**codec.recommend_input(req))

    def execute(self, p: Prepared) -> pb.SelectResponse | Deferred[pb.SelectResponse] | Offload[pb.SelectResponse]:
        """Draws and charges ``p``; the answer (a stored one, marked, for a replay), or the same
        work deferred to the heavy queue when it is expected to be heavy."""
        return self.defer(lambda: codec.select_response(self.selector.execute(self.ledger, p)), p.work, light(p))

    def defer(self, work: Callable[[], T], draws: float, light_work: bool = False) -> T | Deferred[T] | Offload[T]:
        """``work()`` now, in this thread; or (``draws`` above --heavy-draws) a :class:`Deferred`
        for the gate's heavy queue; or, on the event loop and not ``light_work``, an :class:`Offload`
        for a request thread. Either before anything is drawn or spent; or, light work on the loop
        whose commit finds the write lock held elsewhere, after a draw that is discarded unreleased
        and nothing spent."""
        if self.selector.heavy.heavy(draws):
            return Deferred(work)
        if not on_loop():
            return work()
        if not light_work:
            return Offload(work)
        try:  # on the loop the commit must not wait on another process (F5): if it would, a thread retries
            with without_waiting():
                return work()
        except WouldWait:  # nothing stored or spent; the sample drawn here is discarded unreleased
            return Offload(work)

    def _authorize_items(self, caller: Caller, requests: Sequence[pb.SelectRequest]) -> list[Any]:
        """None for each item the caller's scope covers, its PermissionDenied otherwise (one log
        line per batch, with the principal and never the request; throttled per principal)."""
        outcomes: list[Any] = [None] * len(requests)
        denied = 0
        for i, req in enumerate(requests):
            try:
                caller.check_user(req.user_id)
            except PermissionDenied as exc:
                outcomes[i] = exc
                denied += 1
        if denied:
            self.refusals.warning(
                str(caller),
                "PERMISSION_DENIED SelectBatch: %d item(s) for principal %s: another user_id",
                denied,
                caller,
            )
        return outcomes

    @staticmethod
    def _encode_batch(outcomes: Sequence[Any]) -> codec.Framed:
        """Each item's SelectResult: (1, SelectResponse bytes) or (2, Error bytes), framed."""
        results: list[tuple[int, bytes]] = []
        counted: list[tuple[str, str, float, bool]] = []
        for out in outcomes:
            if isinstance(out, tuple) and not isinstance(out[1], Exception):
                p, selected = out
                if selected.replayed:
                    counted.append((selected.answer.mechanism, "OK", 0.0, True))
                else:
                    counted.append((p.mechanism, "OK", p.epsilon, False))
                results.append((1, codec.select_response(selected).SerializeToString()))
                continue
            exc = out[1] if isinstance(out, tuple) else out
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log_internal_error("SelectBatch item", exc)
            counted.append(("", code.name, 0.0, False))
            results.append((2, codec.error(code.value[0], code.name, message)))
        return codec.Framed(codec.batch_response(results), counted)


def register(servicer: SelectionServicer, server: Any) -> None:
    """Adds the service to ``server`` with request decoders that enforce the size limits on the
    raw bytes before parsing (:mod:`recsvc.service.codec`); the gate runs them after authentication."""
    limits = servicer.policy.limits
    methods: dict[str, tuple[Callable[..., Any], Callable[[bytes], Any], Any]] = {
        "Select": (servicer.Select, codec.decoder(pb.SelectRequest, codec.SELECT, limits), pb.SelectResponse),
        "SelectBatch": (
            servicer.SelectBatch,
            codec.decoder(pb.SelectBatchRequest, codec.BATCH, limits),
            pb.SelectBatchResponse,
        ),
        "Recommend": (
            servicer.Recommend,
            codec.decoder(pb.RecommendRequest, codec.RECOMMEND, limits),
            pb.SelectResponse,
        ),
        "GetBudget": (servicer.GetBudget, pb.GetBudgetRequest.FromString, pb.GetBudgetResponse),
        "ListMechanisms": (servicer.ListMechanisms, pb.ListMechanismsRequest.FromString, pb.ListMechanismsResponse),
        "MultiSelect": (
            servicer.MultiSelect,
            codec.decoder(pb.MultiSelectRequest, codec.MULTISELECT, limits),
            pb.MultiSelectResponse,
        ),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=decode, response_serializer=codec.serializer(response)
        )
        for name, (fn, decode, response) in methods.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
