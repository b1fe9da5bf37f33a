"""The server's interceptors: the gate (authentication, rate limit, scopes, decoding) and the
per-call observer (status mapping, metrics, the debug log line).

Installed as ``interceptors=[Gate(...), Observer()]``: the gate runs first, the observer then
wraps the servicer's method.

**The gate.** Every call is authenticated, rate-limited and scope-checked on its raw bytes, and
only then decoded (SECURITY.md). :class:`Gate` re-registers every handler with no request
deserializer, so gRPC hands the behaviour the raw message, in a worker thread (never the
poller). The wrapped behaviour then runs, in this order, each step cheaper than the next:

1. authenticate (bearer token and/or client certificate) → UNAUTHENTICATED;
2. the principal's rate limit → RESOURCE_EXHAUSTED;
3. the method against the principal's scope → PERMISSION_DENIED (logged with the principal);
4. decode with the handler's own deserializer (for PrivateSelection: the bounded pre-scan of
   :mod:`recsvc.service.codec`, then the parser) → INVALID_ARGUMENT, never a traceback;
5. the original behaviour, with the caller in :data:`CALLER` for the per-user checks.

Health checks skip steps 1–3 (load balancers need no credentials) but are decoded the same
safe way. Nothing here reads a request's content, so nothing here can log one.

**The observer.** :class:`Observer` wraps each PrivateSelection method: an exception the method
raises becomes its status code (:func:`status_of`: one lookup), and every
call is counted (``recsvc_requests`` by method, mechanism used and status; ``recsvc_request_seconds``),
with the ε an answer charged (``recsvc_epsilon_spent``) or its replay (``recsvc_replays``).
A SelectBatch answer carries its items' outcomes (:class:`recsvc.service.codec.Framed`), which
are counted the same way under the method ``SelectBatch.item``. Labels never carry user ids,
item ids or scores.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import grpc

from recsvc.service import metrics
from recsvc.service.auth import OPEN_METHOD_PREFIXES, SERVICE_NAME, Authenticator, Caller
from recsvc.service.codec import Framed
from recsvc.service.errors import (
    INTERNAL_MESSAGE,
    PermissionDenied,
    RateLimited,
    Refused,
    ServiceError,
    Unauthenticated,
    log_internal_error,
    status_name,
)
from recsvc.v1 import selection_pb2 as pb

log = logging.getLogger("recsvc.service")

# The authenticated caller of the RPC running in this thread (set by the gate around the behaviour).
CALLER: ContextVar[Caller | None] = ContextVar("recsvc_caller", default=None)
_CODES = grpc.StatusCode.__members__


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message for a refusal (one lookup, :func:`recsvc.service.errors.status_name`);
    an unexpected error's message is withheld."""
    code = _CODES.get(status_name(exc), grpc.StatusCode.INTERNAL)  # a foreign `status` that names no code: INTERNAL
    if code is grpc.StatusCode.INTERNAL:
        return code, INTERNAL_MESSAGE
    return code, str(exc)


def current_caller() -> Caller:
    caller = CALLER.get()
    if caller is None:  # only if a handler runs without the gate: refuse rather than trust
        raise PermissionDenied("no authenticated caller: the server's gate is not installed")
    return caller


class RateLimiter:
    """A token bucket per key: ``rate`` requests/s, bursts of up to max(1, rate). A call is
    admitted while the bucket holds a whole token; :meth:`debit` may take it below zero (a
    SelectBatch pays for its items after they are counted), and later calls wait until it refills."""

    MAX_KEYS = 100_000  # beyond this, full buckets (idle keys) are forgotten

    def __init__(self, rate: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate limit must be a finite number of requests/s > 0, got {rate!r}")
        self.rate, self.burst = rate, max(1.0, rate)
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, monotonic time)
        self._lock = threading.Lock()

    def _level(self, key: str, now: float) -> float:
        tokens, then = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - then) * self.rate)

    def admit(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens = self._level(key, now)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > self.MAX_KEYS:
                self._forget_full(now)
            return True

    def debit(self, key: str, n: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._buckets[key] = (self._level(key, now) - n, now)

    def _forget_full(self, now: float) -> None:
        for key in [k for k in self._buckets if self._level(k, now) >= self.burst]:
            del self._buckets[key]


_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
_INVALID = "the request is not a valid protobuf message for this method; expected a serialized request message"


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


class _Wrapped:
    """Each method's wrapped handler, made once: gRPC looks a handler up on every call, and the
    registered handlers never change, so a wrapper is rebuilt only if its handler is replaced."""

    def __init__(self) -> None:
        self._by_method: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def get(
        self,
        method: str,
        handler: grpc.RpcMethodHandler,
        wrap: Callable[[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler],
    ) -> grpc.RpcMethodHandler:
        """``method``'s wrapper, ``wrap(method, handler)`` on first use."""
        cached = self._by_method.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._by_method[method] = (handler, wrap(method, handler))
        return cached[1]


class Gate(grpc.ServerInterceptor):
    def __init__(
        self,
        authenticator: Authenticator,
        limiter: RateLimiter | None = None,
        open_prefixes: tuple[str, ...] = OPEN_METHOD_PREFIXES,
    ) -> None:
        self.authenticator = authenticator
        self.limiter = limiter
        self._open = open_prefixes
        self._wrapped = _Wrapped()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        return self._wrapped.get(method, handler, self._wrap)

    def _refuse(self, context: grpc.ServicerContext, method: str, refusal: ServiceError) -> None:
        code, message = status_of(refusal)
        metrics.requests(_short(method), "", code.name).inc()
        context.abort(code, message)

    def admit(self, method: str, context: grpc.ServicerContext) -> Caller:
        """Steps 1–3: the caller, or the call is aborted (context.abort raises)."""
        caller = self.authenticator.authenticate(context)
        if caller is None:
            log.debug("UNAUTHENTICATED %s", _short(method))
            self._refuse(
                context,
                method,
                Unauthenticated(
                    "missing or invalid credentials; expected metadata 'authorization: Bearer <token>' "
                    "with a token from the server's token file (and, under mTLS, a client certificate)"
                ),
            )
        assert caller is not None
        if self.limiter is not None and not self.limiter.admit(caller.key):
            log.debug("RESOURCE_EXHAUSTED %s: rate limit of %s", _short(method), caller)
            self._refuse(
                context,
                method,
                RateLimited(f"rate limit exceeded ({self.limiter.rate:g} requests/s per principal); retry later"),
            )
        if not caller.allows_method(method):
            log.warning("PERMISSION_DENIED %s for principal %s", _short(method), caller)
            self._refuse(context, method, PermissionDenied(f"principal {caller} may not call {_short(method)}"))
        return caller

    def _decode(
        self, decode: Callable[[bytes], Any] | None, raw: bytes, method: str, context: grpc.ServicerContext
    ) -> Any:
        """Step 4: a bad message is INVALID_ARGUMENT with our message, never a logged traceback."""
        if decode is None:
            return raw
        try:
            return decode(raw)
        except Refused as exc:
            # A fresh refusal with no traceback or chained exception: their frames hold the raw
            # request, which would otherwise stay alive until the cycle collector runs.
            refusal = Refused(str(exc))
        except Exception:
            refusal = Refused(_INVALID)
        log.debug("INVALID_ARGUMENT %s: the request was refused before parsing or did not parse", _short(method))
        self._refuse(context, method, refusal)
        raise AssertionError("unreachable")  # context.abort raises

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        checked = not method.startswith(self._open)
        decode = handler.request_deserializer
        streaming = handler.request_streaming
        behaviour = {
            (False, False): handler.unary_unary,
            (False, True): handler.unary_stream,
            (True, False): handler.stream_unary,
            (True, True): handler.stream_stream,
        }[(streaming, handler.response_streaming)]

        def gated(request: Any, context: grpc.ServicerContext) -> Any:
            caller = self.admit(method, context) if checked else None
            if streaming:
                request = self._decoded(request, decode, method, context)
            else:
                request = self._decode(decode, request, method, context)
            token = CALLER.set(caller)
            try:
                return behaviour(request, context)
            finally:
                CALLER.reset(token)

        return _KINDS[(streaming, handler.response_streaming)](
            gated, request_deserializer=None, response_serializer=handler.response_serializer
        )

    def _decoded(
        self,
        requests: Iterator[bytes],
        decode: Callable[[bytes], Any] | None,
        method: str,
        context: grpc.ServicerContext,
    ) -> Iterator[Any]:
        for raw in requests:
            yield self._decode(decode, raw, method, context)


class Observer(grpc.ServerInterceptor):
    """Maps each PrivateSelection method's exceptions to status codes and records its metrics
    (see the module docstring); other services (health, reflection) pass through untouched."""

    def __init__(self, prefix: str = f"/{SERVICE_NAME}/") -> None:
        self._prefix = prefix
        self._wrapped = _Wrapped()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix) or handler.unary_unary is None:
            return handler
        return self._wrapped.get(method, handler, self._wrap)

    @staticmethod
    def _wrap(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        name = _short(method)
        behaviour = handler.unary_unary
        latency = metrics.latency(name)

        def observed(request: Any, context: grpc.ServicerContext) -> Any:
            t0 = time.perf_counter()
            code, mechanism = grpc.StatusCode.OK, ""
            try:
                response = behaviour(request, context)
                mechanism = _count_answer(response)
                return response
            except Exception as exc:
                code, message = status_of(exc)
                if code is grpc.StatusCode.INTERNAL:
                    log_internal_error(name, exc)
                context.abort(code, message)
                raise AssertionError("unreachable") from None  # context.abort raises
            finally:
                elapsed = time.perf_counter() - t0
                metrics.requests(name, mechanism, code.name).inc()
                latency.observe(elapsed)
                if log.isEnabledFor(logging.DEBUG):  # no formatting work unless asked for
                    log.debug("%s %s mechanism=%s %.2fms", name, code.name, mechanism or "-", elapsed * 1e3)

        return grpc.unary_unary_rpc_method_handler(
            observed, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


def _count_answer(response: Any) -> str:
    """Counts what an answer spent (or that it replayed); returns the mechanism label of the call."""
    if isinstance(response, pb.SelectResponse):
        if response.replayed:
            metrics.REPLAYS.inc()
        else:
            metrics.epsilon_spent(response.mechanism).inc(response.epsilon_spent)
        return response.mechanism
    if isinstance(response, pb.MultiSelectResponse):
        if response.replayed:
            metrics.REPLAYS.inc()
        elif response.charged:
            metrics.epsilon_spent("multiselect").inc(response.epsilon_spent)
        return "multiselect"
    if isinstance(response, Framed):
        _count_items(response.outcomes)
    return ""


def _count_items(outcomes: list[tuple[str, str, float, bool]]) -> None:
    """A batch's items (see :class:`recsvc.service.codec.Framed`), counted as SelectBatch.item calls."""
    counts: Counter[tuple[str, str]] = Counter()
    spent: defaultdict[str, float] = defaultdict(float)
    replays = 0
    for mechanism, status, epsilon, replay in outcomes:
        counts[mechanism, status] += 1
        if replay:
            replays += 1
        elif epsilon:
            spent[mechanism] += epsilon
    for (mechanism, status), n in counts.items():
        metrics.requests("SelectBatch.item", mechanism, status).inc(n)
    for mechanism, eps in spent.items():
        metrics.epsilon_spent(mechanism).inc(eps)
    if replays:
        metrics.REPLAYS.inc(replays)
