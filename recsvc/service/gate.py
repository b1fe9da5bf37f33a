"""The server's gate: every call is authenticated, rate-limited and scope-checked on its raw
bytes, and only then decoded (SECURITY.md).

:class:`Gate` is a server interceptor that re-registers every handler with no request
deserializer, so gRPC hands the behaviour the raw message, in a worker thread (never the
poller). The wrapped behaviour then runs, in this order, each step cheaper than the next:

1. authenticate (bearer token and/or client certificate) → UNAUTHENTICATED;
2. the principal's rate limit → RESOURCE_EXHAUSTED;
3. the method against the principal's scope → PERMISSION_DENIED (logged with the principal);
4. decode with the handler's own deserializer (for PrivateSelection: the bounded pre-scan of
   :mod:`recsvc.service.wire`, then the parser) → INVALID_ARGUMENT, never a traceback;
5. the original behaviour, with the caller in :data:`CALLER` for the per-user checks.

Health checks skip steps 1–3 (load balancers need no credentials) but are decoded the same
safe way. Nothing here reads a request's content, so nothing here can log one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import grpc

from recsvc.service import metrics
from recsvc.service.auth import OPEN_METHOD_PREFIXES, Authenticator, Caller, PermissionDenied
from recsvc.service.wire import Refused

log = logging.getLogger("recsvc.service")

# The authenticated caller of the RPC running in this thread (set by the gate around the behaviour).
CALLER: ContextVar[Caller | None] = ContextVar("recsvc_caller", default=None)


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


class Gate(grpc.ServerInterceptor):
    def __init__(self, authenticator: Authenticator, limiter: RateLimiter | None = None,
                 open_prefixes: tuple[str, ...] = OPEN_METHOD_PREFIXES) -> None:
        self.authenticator = authenticator
        self.limiter = limiter
        self._open = open_prefixes
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:  # handlers are registered once: wrap each once
            cached = self._wrapped[method] = (handler, self._wrap(method, handler))
        return cached[1]

    def _refuse(self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, message: str) -> None:
        metrics.requests(_short(method), "", code.name).inc()
        context.abort(code, message)

    def admit(self, method: str, context: grpc.ServicerContext) -> Caller:
        """Steps 1–3: the caller, or the call is aborted (context.abort raises)."""
        caller = self.authenticator.authenticate(context)
        if caller is None:
            log.debug("UNAUTHENTICATED %s", _short(method))
            self._refuse(context, method, grpc.StatusCode.UNAUTHENTICATED,
                         "missing or invalid credentials; expected metadata 'authorization: Bearer <token>' "
                         "with a token from the server's token file (and, under mTLS, a client certificate)")
        assert caller is not None
        if self.limiter is not None and not self.limiter.admit(caller.key):
            log.debug("RESOURCE_EXHAUSTED %s: rate limit of %s", _short(method), caller)
            self._refuse(context, method, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"rate limit exceeded ({self.limiter.rate:g} requests/s per principal); retry later")
        if not caller.allows_method(method):
            log.warning("PERMISSION_DENIED %s for principal %s", _short(method), caller)
            self._refuse(context, method, grpc.StatusCode.PERMISSION_DENIED,
                         f"principal {caller} may not call {_short(method)}")
        return caller

    def _decode(self, decode: Callable[[bytes], Any] | None, raw: bytes, method: str,
                context: grpc.ServicerContext) -> Any:
        """Step 4: a bad message is INVALID_ARGUMENT with our message, never a logged traceback."""
        if decode is None:
            return raw
        try:
            return decode(raw)
        except Refused as exc:
            message = str(exc)
        except Exception:  # noqa: BLE001 - a parser's error may quote the bytes: say nothing of them
            message = _INVALID
        log.debug("INVALID_ARGUMENT %s: the request was refused before parsing or did not parse", _short(method))
        self._refuse(context, method, grpc.StatusCode.INVALID_ARGUMENT, message)
        raise AssertionError("unreachable")  # context.abort raises

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        checked = not method.startswith(self._open)
        decode = handler.request_deserializer
        streaming = handler.request_streaming
        behaviour = {
            (False, False): handler.unary_unary, (False, True): handler.unary_stream,
            (True, False): handler.stream_unary, (True, True): handler.stream_stream,
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
            gated, request_deserializer=None, response_serializer=handler.response_serializer)

    def _decoded(self, requests: Iterator[bytes], decode: Callable[[bytes], Any] | None, method: str,
                 context: grpc.ServicerContext) -> Iterator[Any]:
        for raw in requests:
            yield self._decode(decode, raw, method, context)
