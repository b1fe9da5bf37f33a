"""The server's gate: every call's admission (authentication, rate limit, scope, the bounds of
:mod:`recsvc.service.admission`), the reading and decoding of its message, and the observation
of its outcome (status code, metrics, the debug log line).

Installed as ``grpc.aio.server(interceptors=[Gate(...)])``. The gate re-registers every handler
as a request-streaming one with no deserializer, so gRPC hands it the call before any of the
message is read. The wrapped call then runs, in this order, each step cheaper than the next:

1. authenticate on the metadata (bearer token and/or client certificate) → UNAUTHENTICATED;
2. the principal's rate limit → RESOURCE_EXHAUSTED;
3. the method against the principal's scope → PERMISSION_DENIED (logged with the principal);
4. a slot of the method's pool (:meth:`Gate.pool_of`): ``--max-concurrent-rpcs`` for a unary call,
   ``--max-streaming-calls`` for a streaming one (server reflection), so that streams, which live
   as long as their clients want, never hold a unary call's slot; of each pool one principal holds
   at most ``--principal-share`` → RESOURCE_EXHAUSTED, counted (``recsvc_gate_refusals``) and
   logged at most 5 lines a minute per principal (the servicer's :class:`ThrottledLog`);
5. read the message, within ``--receive-timeout`` → DEADLINE_EXCEEDED; a stream's every message
   and answer, within ``--stream-idle-timeout`` of the last (:meth:`Gate._stream`), or it is ended;
6. its bytes from ``--max-inflight-bytes``, within the principal's share → RESOURCE_EXHAUSTED;
7. decode with the handler's own deserializer (for PrivateSelection: the bounded pre-scan of
   :mod:`recsvc.service.codec`, then the parser) → INVALID_ARGUMENT, never a traceback; then the
   method's :class:`recsvc.service.draws.UseCase`: ``prepare`` checks the request once and prices
   it (:class:`recsvc.service.draws.Price`, public quantities only), given the authenticated
   caller for the per-user checks; a refusal raised here spends nothing;
8. the gate picks the pool from the price (:meth:`Gate.pool_for`), and ``run`` reserves, draws,
   commits and returns the response message there: the bounded heavy queue when the price is
   above ``--heavy-draws`` (→ RESOURCE_EXHAUSTED when full, nothing drawn or spent; the call holds
   no request thread while it waits), else the request thread that prepared it. A call that is
   **alone** (:meth:`Gate.alone`: one of the ``inline`` methods, at most :data:`INLINE_BYTES`, no
   other call admitted and no thread busy) is decoded and prepared on the event loop instead,
   saving the two thread wake-ups, and runs there too if its price is light, under
   :func:`recsvc.ledger.without_waiting` (a commit that would wait on another process runs again
   in a request thread, the sample drawn on the loop discarded unreleased, nothing spent); else in
   a request thread.

Steps 1–7 spend nothing. Health checks skip steps 1–3 (load balancers need no credentials):
Check takes no slot, and Watch a slot of ``--max-health-watches``, shared per peer address.
Nothing here reads a request's content, so nothing here can log one.

**Observation.** For each PrivateSelection method an exception the method raises becomes its
status code (:func:`status_of`: one lookup), and every call is counted (``recsvc_requests`` by
method, mechanism used and status; ``recsvc_request_seconds``), with the ε an answer charged
(``recsvc_epsilon_spent``) or its replay (``recsvc_replays``). A SelectBatch answer carries its
items' outcomes (:class:`recsvc.service.codec.Framed`), which are counted the same way under the
method ``SelectBatch.item``. Labels never carry user ids, item ids or scores.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from enum import Enum
from typing import Any, NoReturn

import grpc

from recsvc.ledger import WouldWait, without_waiting
from recsvc.service import metrics
from recsvc.service.admission import Admission, Full, RateLimiter, Shares
from recsvc.service.auth import OPEN_METHOD_PREFIXES, SERVICE_NAME, Authenticator, Caller, anonymous_key
from recsvc.service.config import Admission as AdmissionSettings
from recsvc.service.draws import HeavyCalls, Price, Priced, UseCase
from recsvc.service.errors import (
    INTERNAL_MESSAGE,
    InvalidRequest,
    Overloaded,
    PermissionDenied,
    RateLimited,
    ReceiveTimeout,
    Refused,
    ServiceError,
    ThrottledLog,
    Unauthenticated,
    log_internal_error,
    status_name,
)
from recsvc.service.threads import Threads

log = logging.getLogger("recsvc.service")

# The largest message a lone call may run from on the loop: a Select of ≈ 900 candidates named by
# id, ≈ 0.5 ms of work in all (500 candidates, what the benchmarks send, are 8.8 kB and ≈ 0.3 ms).
INLINE_BYTES = 16 * 1024
_CODES = grpc.StatusCode.__members__
WATCH = "/grpc.health.v1.Health/Watch"


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message for a refusal (one lookup, :func:`recsvc.service.errors.status_name`);
    an unexpected error's message is withheld."""
    code = _CODES.get(status_name(exc), grpc.StatusCode.INTERNAL)  # a foreign `status` that names no code: INTERNAL
    if code is grpc.StatusCode.INTERNAL:
        return code, INTERNAL_MESSAGE
    return code, str(exc)


class Abort(Exception):
    """A refusal already counted: the gate ends the call with this status on the event loop."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.code, self.message = code, message


_KINDS: dict[bool, Callable[..., grpc.RpcMethodHandler]] = {
    False: grpc.stream_unary_rpc_method_handler,
    True: grpc.stream_stream_rpc_method_handler,
}
_INVALID = (
    "the request is not a valid protobuf message for this method (or a compressed message: this server never "
    "decompresses requests); expected an uncompressed serialized request message"
)


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


class Where(Enum):
    """The pool a priced call runs in (:meth:`Gate.pool_for`)."""

    LOOP = "the event loop"
    THREAD = "a request thread"
    HEAVY = "the heavy queue"


@dataclass(frozen=True)
class Pool:
    """What a call holds while it is served, and how a refusal names it (``what`` in ``flag``)."""

    slots: Shares
    what: str
    flag: str


class Gate(grpc.aio.ServerInterceptor):
    """See the module docstring. ``pool`` runs the synchronous methods (the request threads);
    ``heavy`` runs the calls its price sends there; ``inline``: the methods a lone call may run on the event
    loop (only where no commit waits on another process or the network: :func:`recsvc.service.aioserver.inline_methods`)."""

    def __init__(
        self,
        authenticator: Authenticator,
        limiter: RateLimiter | None = None,
        admission: Admission | None = None,
        pool: Threads | None = None,
        heavy: HeavyCalls | None = None,
        inline: Collection[str] = (),
        refusals: ThrottledLog | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.limiter = limiter
        self.admission = admission or Admission(AdmissionSettings())
        self.pool = pool
        self.heavy = heavy
        self.inline = frozenset(inline)
        # Each method's (handler, wrapper), made once: gRPC looks a handler up on every call, and the
        # registered handlers never change, so a wrapper is rebuilt only if its handler is replaced.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self._refusals = ThrottledLog() if refusals is None else refusals  # the servicer's: one budget per principal

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self._wrap(method, handler))
        return cached[1]

    def _refuse(self, method: str, refusal: ServiceError) -> NoReturn:
        """Counts the refusal and ends the call: raises :class:`Abort`."""
        code, message = status_of(refusal)
        metrics.requests(_short(method), "", code.name).inc()
        raise Abort(code, message)

    def admit(self, method: str, context: grpc.aio.ServicerContext) -> Caller:
        """Steps 1–3 on the metadata: the caller, or :class:`Abort`."""
        caller = self.authenticator.authenticate(context)
        if caller is None:
            log.debug("UNAUTHENTICATED %s", _short(method))
            self._refuse(
                method,
                Unauthenticated(
                    "missing or invalid credentials; expected metadata 'authorization: Bearer <token>' "
                    "with a token from the server's token file (and, under mTLS, a client certificate)"
                ),
            )
        if self.limiter is not None and not self.limiter.admit(caller.key):
            log.debug("RESOURCE_EXHAUSTED %s: rate limit of %s", _short(method), caller)
            self._refuse(
                method,
                RateLimited(f"rate limit exceeded ({self.limiter.rate:g} requests/s per principal); retry later"),
            )
        if not caller.allows_method(method):
            self._refusals.warning(str(caller), "PERMISSION_DENIED %s for principal %s", _short(method), caller)
            self._refuse(method, PermissionDenied(f"principal {caller} may not call {_short(method)}"))
        return caller

    def pool_of(self, method: str, streams: bool) -> Pool | None:
        """The slots a call of ``method`` holds (``streams``: its request or its answer is a stream);
        None for an open unary method (Health/Check)."""
        a = self.admission
        if method == WATCH:
            return Pool(a.watches, "health watchers", "--max-health-watches")
        if method.startswith(OPEN_METHOD_PREFIXES):
            return None
        if streams:
            return Pool(a.streams, "streaming calls", "--max-streaming-calls")
        return Pool(a.rpcs, "calls", "--max-concurrent-rpcs")

    def _take(self, pool: Pool, method: str, key: str, caller: Caller | None, n: int = 1) -> None:
        """Takes ``n`` of ``pool`` for principal ``key`` (``caller``'s, or an anonymous peer's), or
        refuses the call RESOURCE_EXHAUSTED (:class:`Abort`), counted and logged within the throttle."""
        full = pool.slots.take_for(key, n)
        if full is None:
            return
        metrics.refusals(pool.flag, full.value).inc()
        limit = pool.slots.limit
        if full is Full.TOTAL:
            self._refusals.warning(
                pool.flag, "RESOURCE_EXHAUSTED %s: %d %s in flight", _short(method), limit, pool.what
            )
            message = f"this worker already serves {limit} {pool.what} ({pool.flag}); retry later"
        else:
            held, fraction = pool.slots.held_by(key), pool.slots.fraction
            who = key if caller is None else str(caller)
            self._refusals.warning(
                who, "RESOURCE_EXHAUSTED %s for principal %s: its share of %s", _short(method), who, pool.flag
            )
            message = (
                f"this call's principal already holds {held} of this worker's {limit} {pool.what} ({pool.flag}); "
                f"one principal may hold {fraction:g} of them (--principal-share); retry later"
            )
        self._refuse(method, Overloaded(message))

    async def _stream(self, context: grpc.aio.ServicerContext, method: str, result: Any) -> Any:
        """A streaming call's behaviour, ended DEADLINE_EXCEEDED when a step (reading the next request
        and writing its answer) takes ``--stream-idle-timeout``: a client that neither sends nor
        reads holds its slot no longer. A Watch, whose client sends nothing after its request and
        whose writes the gate does not see, lasts that long at most; its client watches again."""
        idle = self.admission.stream_idle_timeout
        try:
            if inspect.isawaitable(result):  # it writes its own answers (Health/Watch)
                async with asyncio.timeout(idle):
                    return await result
            answers = aiter(result)  # an async generator left suspended is closed by the loop's finalizer
            while True:
                async with asyncio.timeout(idle):  # the behaviour reads the next request within its step
                    try:
                        answer = await anext(answers)
                    except StopAsyncIteration:
                        return None
                    await context.write(answer)
        except TimeoutError:
            log.debug("DEADLINE_EXCEEDED %s: no message for %gs", _short(method), idle)
            self._refuse(
                method,
                ReceiveTimeout(
                    f"the stream passed no message for {idle:g}s (--stream-idle-timeout) and was ended; call again"
                ),
            )

    def alone(self, method: str, size: int) -> bool:
        """Whether a call of ``method`` with a ``size``-byte message may run on the event loop: an
        ``inline`` method, a small message, and nothing else in flight (no other call admitted,
        no request thread or heavy call still at work), so its bounded work delays no one who
        is already waiting, and a call that arrives meanwhile waits for it at most."""
        return (
            method in self.inline
            and size <= INLINE_BYTES
            and self.admission.rpcs.held == 1
            and (self.pool is None or self.pool.pending == 0)
            and (self.heavy is None or self.heavy.held == 0)
        )

    def pool_for(self, price: Price, alone: bool) -> Where:
        """Where a call of ``price`` runs: the heavy queue above ``--heavy-draws``; else, for a lone
        call (:meth:`alone`) whose work is light, the event loop; else a request thread."""
        if self.heavy is not None and self.heavy.takes(price):
            return Where.HEAVY
        return Where.LOOP if alone and price.light else Where.THREAD

    async def _receive(self, context: grpc.aio.ServicerContext, method: str) -> bytes:
        """Step 5: the one request message, or :class:`Abort` when it is late or missing."""
        timeout, reads = self.admission.receive_timeout, self.admission.reads
        task = asyncio.current_task()
        assert task is not None  # a call's coroutine runs in its task
        reads.start(task)
        try:
            raw = await context.read()
        except asyncio.CancelledError:
            if not reads.expired(task):  # cancelled by someone else
                raise
            task.uncancel()
            log.debug("DEADLINE_EXCEEDED %s: no request message within %gs", _short(method), timeout)
            self._refuse(
                method,
                ReceiveTimeout(
                    f"the request message did not arrive within {timeout:g}s of the call's headers "
                    "(--receive-timeout); expected the whole message promptly"
                ),
            )
        finally:
            reads.end(task)
        if raw is grpc.aio.EOF:
            self._refuse(method, InvalidRequest("the call carried no request message; expected one"))
        return raw  # bytes: the handler has no deserializer

    def _decode(self, decode: Callable[[bytes], Any] | None, raw: bytes, method: str) -> Any:
        """Step 7's decoding: a bad message is INVALID_ARGUMENT with our message, never a logged traceback."""
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
        self._refuse(method, refusal)

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        checked = not method.startswith(OPEN_METHOD_PREFIXES)
        observed = method.startswith(f"/{SERVICE_NAME}/") and isinstance(handler.unary_unary, UseCase)
        decode = handler.request_deserializer
        streaming = handler.request_streaming
        behaviour = {
            (False, False): handler.unary_unary,
            (False, True): handler.unary_stream,
            (True, False): handler.stream_unary,
            (True, True): handler.stream_stream,
        }[(streaming, handler.response_streaming)]
        streams = streaming or handler.response_streaming
        pool = self.pool_of(method, streams)
        inflight = Pool(self.admission.bytes, "request bytes", "--max-inflight-bytes")
        name = _short(method)

        async def gated(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            key, held = "", 0
            taken = False
            try:
                caller = self.admit(method, context) if checked else None
                key = caller.key if caller is not None else anonymous_key(context.peer())
                if pool is not None:
                    self._take(pool, method, key, caller)
                    taken = True
                if streaming:
                    return await self._stream(
                        context, method, behaviour(self._decoded(requests, decode, method), context)
                    )
                raw = await self._receive(context, method)
                self._take(inflight, method, key, caller, len(raw))
                held = len(raw)
                if observed:
                    return await self._observe(method, name, behaviour, decode, raw, caller, key)
                result = behaviour(self._decode(decode, raw, method), context)
                if streams:
                    return await self._stream(context, method, result)
                return await result if inspect.isawaitable(result) else result
            except Abort as abort:
                await context.abort(abort.code, abort.message)
            finally:
                if taken and pool is not None:
                    pool.slots.give_for(key)
                if held:
                    inflight.slots.give_for(key, held)

        return _KINDS[handler.response_streaming](
            gated, request_deserializer=None, response_serializer=handler.response_serializer
        )

    async def _observe(
        self,
        method: str,
        name: str,
        case: UseCase[Any, Any, Any],
        decode: Callable[[bytes], Any] | None,
        raw: bytes,
        caller: Caller | None,
        key: str,
    ) -> Any:
        """Steps 7 and 8: decode → prepare (validated once, priced) → the pool its price chooses →
        run → the response message; the outcome mapped to its status and counted."""
        t0 = time.perf_counter()
        code, mechanism, counted = grpc.StatusCode.OK, "", True
        assert self.pool is not None, "the gate needs the request threads to run a method"

        def prepare() -> Priced[Any]:
            if caller is None:  # only an open method has none, and none of them is observed
                raise PermissionDenied("no authenticated caller for this method")
            return case.prepare(caller, self._decode(decode, raw, method))

        def in_thread() -> tuple[Priced[Any], Any]:
            """Prepared, and run in this same thread unless its price sends it to the heavy queue
            (one hop to a thread and back, not two); None in place of the response then."""
            priced = prepare()
            if self.pool_for(priced.price, alone=False) is Where.HEAVY:
                return priced, None
            return priced, case.run(priced.value)

        try:
            response = None
            if self.alone(method, len(raw)):
                priced = prepare()
                where = self.pool_for(priced.price, alone=True)
                if where is Where.LOOP:
                    try:  # on the loop the commit must not wait on another process (F5)
                        with without_waiting():
                            response = case.run(priced.value)
                    except WouldWait:  # nothing stored or spent; the sample drawn here is discarded unreleased
                        where = Where.THREAD
                if where is Where.THREAD:
                    response = await self.pool.run(lambda: case.run(priced.value))
            else:
                priced, response = await self.pool.run(in_thread)
                where = Where.THREAD if response is not None else Where.HEAVY
            if where is Where.HEAVY:
                assert self.heavy is not None  # pool_for chose it
                response = await self.heavy.run(key, lambda: case.run(priced.value))
            mechanism = metrics.count_answer(response)
            return response
        except Abort:
            counted = False  # refused while decoding, and counted then
            raise
        except Exception as exc:
            code, message = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log_internal_error(name, exc)
            raise Abort(code, message) from None
        finally:
            if counted:
                elapsed = time.perf_counter() - t0
                metrics.requests(name, mechanism, code.name).inc()
                metrics.latency(name).observe(elapsed)
                if log.isEnabledFor(logging.DEBUG):  # no formatting work unless asked for
                    log.debug("%s %s mechanism=%s %.2fms", name, code.name, mechanism or "-", elapsed * 1e3)

    async def _decoded(
        self, requests: AsyncIterator[bytes], decode: Callable[[bytes], Any] | None, method: str
    ) -> AsyncIterator[Any]:
        async for raw in requests:
            yield self._decode(decode, raw, method)
