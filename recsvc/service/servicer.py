"""The PrivateSelection servicer (docs/conventions.md, "One way to write an RPC"). Each RPC is a
:class:`recsvc.service.draws.UseCase` of two plain synchronous steps, registered in :func:`register`
with its decoder: ``price_<name>(caller, request)`` authorizes the decoded request for the
authenticated caller and checks it once, touching no ledger, and prices it from public quantities
(:class:`~recsvc.service.draws.Priced`); ``answer_<name>`` (:meth:`answer` for Select and Recommend)
reserves, draws, commits and returns the response message. The gate (:mod:`recsvc.service.interceptors`)
runs them, in the pool the price chooses; in process, ``answer(price_select(caller, request).value)``
is a Select. The wire format is :mod:`recsvc.service.codec`; every selection rule is the proto-free
:mod:`recsvc.service.selection`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from recsvc.artifact import Artifact
from recsvc.ledger import Ledger
from recsvc.service import codec
from recsvc.service.admission import RateLimiter
from recsvc.service.auth import SERVICE_NAME, Caller
from recsvc.service.batch import execute_batch
from recsvc.service.config import SelectorConfig
from recsvc.service.draws import Price, Priced, UseCase, price_of
from recsvc.service.errors import PermissionDenied, ThrottledLog, log_internal_error
from recsvc.service.interceptors import status_of
from recsvc.service.multiselect import MultiPrepared, MultiSelector
from recsvc.service.requests import Columns, Prepared, check_user_id
from recsvc.service.selection import Selector
from recsvc.v1 import selection_pb2 as pb

log = logging.getLogger("recsvc.service")


@dataclass(frozen=True)
class Batch:
    """A SelectBatch checked item by item: each item's refusal, None where it is prepared."""

    outcomes: list[Exception | None]
    prepared: dict[int, Prepared]  # by item index


class SelectionServicer:
    def __init__(self, artifact: Artifact, ledger: Ledger | None, config: SelectorConfig) -> None:
        self.selector = Selector(artifact, config)
        self.multi = MultiSelector(artifact, config)
        self.config = config
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

    # -- prepare: authorize, check once, price (no ledger, no draw) ----------------------------

    def price_select(self, caller: Caller, request: pb.SelectRequest) -> Priced[Prepared]:
        self.authorize(caller, "Select", request.user_id)
        p = self.prepare_select(request)
        return Priced(p, price_of(p))

    def price_recommend(self, caller: Caller, request: pb.RecommendRequest) -> Priced[Prepared]:
        self.authorize(caller, "Recommend", request.user_id)
        p = self.selector.prepare_recommend(**codec.recommend_input(request))
        return Priced(p, price_of(p))

    def price_batch(self, caller: Caller, request: pb.SelectBatchRequest) -> Priced[Batch]:
        """Each item authorized, decoded and checked alone (a refusal is that item's Error and
        spends nothing); priced at the draws of all the items that passed."""
        # the batch's size was checked before parsing (codec.BATCH)
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
        return Priced(Batch(outcomes, prepared), Price(sum(p.work for p in prepared.values())))

    def price_multiselect(self, caller: Caller, request: pb.MultiSelectRequest) -> Priced[MultiPrepared]:
        self.authorize(caller, "MultiSelect", request.user_id)
        return Priced(self.multi.prepare(**codec.multiselect_input(request)))

    def price_budget(self, caller: Caller, request: pb.GetBudgetRequest) -> Priced[str]:
        self.authorize(caller, "GetBudget", request.user_id)
        check_user_id(request.user_id)
        return Priced(request.user_id)

    def price_mechanisms(self, caller: Caller, request: pb.ListMechanismsRequest) -> Priced[None]:
        return Priced(None)

    # -- answer: reserve → draw → commit → encode once, in the pool the price chose ------------

    def answer(self, p: Prepared) -> pb.SelectResponse:
        """Draws and charges ``p``; the answer (a stored one, marked, for a replay)."""
        return codec.select_response(self.selector.execute(self.ledger, p))

    def answer_batch(self, batch: Batch) -> codec.Framed:
        """The serialized SelectBatchResponse: the prepared items drawn vectorised and charged in
        ONE ledger transaction."""
        outcomes: list[Any] = list(batch.outcomes)
        if batch.prepared:
            charged = execute_batch(self.selector, self.ledger, list(batch.prepared.values()))
            for (i, p), charge in zip(batch.prepared.items(), charged, strict=False):
                outcomes[i] = (p, charge)
        return self._encode_batch(outcomes)

    def answer_multiselect(self, p: MultiPrepared) -> pb.MultiSelectResponse:
        return codec.multiselect_message(self.multi.execute(self.ledger, p))

    def answer_budget(self, user_id: str) -> pb.GetBudgetResponse:
        u = self.ledger.user(user_id)
        return pb.GetBudgetResponse(
            user_id=u.user_id,
            budget=u.budget,
            spent=u.spent,
            remaining=u.remaining,
            requests=u.requests,
            window_start_unix=u.window_start,
            window_end_unix=u.window_end,
        )

    def answer_mechanisms(self, _: None) -> pb.ListMechanismsResponse:
        return codec.mechanisms_response(self.selector, self.config, self.ledger.budget, self.multi)

    # -- the steps ---------------------------------------------------------------------------

    def authorize(self, caller: Caller, method: str, user_id: str) -> None:
        """PERMISSION_DENIED (logged with the principal, never the request) unless ``caller``'s
        scope covers ``user_id``; runs before any check, so an out-of-scope call costs nothing."""
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
        """The SelectBatchResponse, each item's SelectResult its response or its Error, serialized once."""
        results: list[pb.SelectResult] = []
        counted: list[tuple[str, str, float, bool]] = []
        for out in outcomes:
            if isinstance(out, tuple) and not isinstance(out[1], Exception):
                p, selected = out
                if selected.replayed:
                    counted.append((selected.answer.mechanism, "OK", 0.0, True))
                else:
                    counted.append((p.mechanism, "OK", p.epsilon, False))
                results.append(pb.SelectResult(response=codec.select_response(selected)))
                continue
            exc = out[1] if isinstance(out, tuple) else out
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log_internal_error("SelectBatch item", exc)
            counted.append(("", code.name, 0.0, False))
            results.append(pb.SelectResult(error=pb.Error(code=code.value[0], code_name=code.name, message=message)))
        return codec.Framed(pb.SelectBatchResponse(results=results).SerializeToString(), counted)


def register(servicer: SelectionServicer, server: Any) -> None:
    """Adds the service to ``server`` with request decoders that enforce the size limits on the
    raw bytes before parsing (:mod:`recsvc.service.codec`); the gate runs them after authentication.
    Each method's request and response types are the proto's."""
    s = servicer
    # each method's use case and what its pre-scan counts (None: no repeated field, parsed as it is)
    cases: dict[str, tuple[UseCase[Any, Any, Any], codec.Shape | None]] = {
        "Select": (UseCase(s.price_select, s.answer), codec.SELECT),
        "SelectBatch": (UseCase(s.price_batch, s.answer_batch), codec.BATCH),
        "Recommend": (UseCase(s.price_recommend, s.answer), codec.RECOMMEND),
        "GetBudget": (UseCase(s.price_budget, s.answer_budget), None),
        "ListMechanisms": (UseCase(s.price_mechanisms, s.answer_mechanisms), None),
        "MultiSelect": (UseCase(s.price_multiselect, s.answer_multiselect), codec.MULTISELECT),
    }
    service = pb.DESCRIPTOR.services_by_name["PrivateSelection"]
    handlers = {}
    for name, (case, shape) in cases.items():
        method = service.methods_by_name[name]
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        decode = request.FromString if shape is None else codec.decoder(request, shape, servicer.config.limits)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            case, request_deserializer=decode, response_serializer=codec.serializer(response)
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
