"""The service's refusals and the status code each one carries.

Every error a client can see declares ``status``, the NAME of a :class:`grpc.StatusCode`
member, as a class attribute; :func:`status_name` maps any exception with one walk up its MRO,
so a new error needs no change here (:func:`recsvc.service.interceptors.status_of` turns the
name into the code). This module imports no grpc: the selection layer raises these errors. Errors raised by the core and the ledger declare the same
attribute as a plain string (they never import grpc). Messages quote no scores: they are sent
to the client as they are, except an unexpected error's, which is withheld (see
:func:`log_internal_error`).

:data:`STATUS_TABLE` is the table of every status code the service answers with, and why; the
reference page ``docs/reference/status-codes.md`` can be generated from it.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import ClassVar

log = logging.getLogger("recsvc.service")

INTERNAL_MESSAGE = "internal error; see the server log"


class ServiceError(Exception):
    """Base of the service's own refusals; nothing was spent."""

    status: ClassVar[str] = "INTERNAL"


class InvalidRequest(ServiceError, ValueError):
    """Bad input: INVALID_ARGUMENT, nothing spent. Messages never contain score values."""

    status: ClassVar[str] = "INVALID_ARGUMENT"


class Refused(InvalidRequest):
    """A request refused before parsing (bounded pre-scan or a malformed message): INVALID_ARGUMENT.
    The message quotes no request data."""


class Unavailable(ServiceError):
    """The request is well-formed but this server cannot serve it (FAILED_PRECONDITION)."""

    status: ClassVar[str] = "FAILED_PRECONDITION"


class PermissionDenied(ServiceError):
    """An authenticated caller asked for something outside its scope (PERMISSION_DENIED, nothing spent)."""

    status: ClassVar[str] = "PERMISSION_DENIED"


class Unauthenticated(ServiceError):
    """No valid credentials (bearer token and/or client certificate)."""

    status: ClassVar[str] = "UNAUTHENTICATED"


class RateLimited(ServiceError):
    """The principal's rate limit is used up; retrying later succeeds."""

    status: ClassVar[str] = "RESOURCE_EXHAUSTED"


class Overloaded(ServiceError):
    """A bound on what calls in flight may hold is reached (RPCs, request bytes, heavy draws,
    health watchers); nothing was read past the headers or spent, and retrying later succeeds."""

    status: ClassVar[str] = "RESOURCE_EXHAUSTED"


class Interrupted(ServiceError):
    """A part of the server ended during this call's work (its draw process died): nothing was
    drawn for the caller or spent, and a retry with the same request_id is served (UNAVAILABLE)."""

    status: ClassVar[str] = "UNAVAILABLE"


class ReceiveTimeout(ServiceError):
    """The request's message did not arrive within --receive-timeout of its headers."""

    status: ClassVar[str] = "DEADLINE_EXCEEDED"


# Builtins cannot declare ``status``: a ValueError is the core's check of an input the service
# checked already, with a message of its own. Keyed by class; :func:`status_name` consults it
# after the class's own attribute.
FOREIGN_STATUS: dict[type[BaseException], str] = {ValueError: "INVALID_ARGUMENT"}


def status_name(exc: BaseException) -> str:
    """The name of ``exc``'s status code: the nearest class in its MRO that declares ``status``
    (or has an entry in :data:`FOREIGN_STATUS`); INTERNAL for anything else."""
    for cls in type(exc).__mro__:
        name = vars(cls).get("status") or FOREIGN_STATUS.get(cls)
        if isinstance(name, str):
            return name
    return "INTERNAL"


def log_internal_error(what: str, exc: BaseException) -> None:
    """Logs an unexpected failure by type and stack only: an exception's message (e.g. one of
    numpy's) may quote the values it was given, and those may be a user's scores."""
    stack = "".join(traceback.format_tb(exc.__traceback__))
    log.error("%s failed with an internal error: %s (message withheld)\n%s", what, type(exc).__name__, stack)


class ThrottledLog:
    """Refusal warnings, at most ``burst`` lines per key (a principal) per ``period`` seconds: a
    caller that is refused in a loop cannot flood the log. The next line let through says how many
    were held back; every refusal is still counted in the metrics."""

    def __init__(self, burst: int = 5, period: float = 60.0) -> None:
        self.burst, self.period = burst, period
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (window start, lines, held back)

    def warning(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            start, lines, held = self._windows.get(key, (now, 0, 0))
            if now - start >= self.period:
                start, lines = now, 0
            if lines >= self.burst:
                self._windows[key] = (start, lines, held + 1)
                return
            self._windows[key] = (start, lines + 1, 0)
            if len(self._windows) > 10_000:  # bounded: forget the oldest windows
                for k in sorted(self._windows, key=lambda k: self._windows[k][0])[:5_000]:
                    del self._windows[k]
        if held:
            message += " (and %d more like it held back)"
            args = (*args, held)
        log.warning(message, *args)


# (status code, raised as, when): the source of the table in docs/reference/status-codes.md
# (`python -m recsvc.app.docs` writes it). Nothing is spent on any refusal; a SelectBatch answers
# each item's refusal as that item's Error (code, code_name, message) and the call itself is OK.
STATUS_TABLE: tuple[tuple[str, str, str], ...] = (
    ("OK", "", "the answer; a replayed request_id returns the stored answer with replayed=true"),
    (
        "INVALID_ARGUMENT",
        "InvalidRequest, Refused, ValueError",
        "a malformed or out-of-limit request (checked on the raw bytes before parsing where possible), "
        "a bad parameter (details below)",
    ),
    (
        "FAILED_PRECONDITION",
        "Unavailable",
        "well-formed, but this server cannot serve it: Recommend on an artifact without a model, "
        "MultiSelect on one without a client bundle, or item_rows for another catalog_version",
    ),
    ("UNAUTHENTICATED", "Unauthenticated", "a missing or wrong bearer token (with --token-file) or client certificate"),
    ("PERMISSION_DENIED", "PermissionDenied", "the principal's scope does not cover the RPC or the user_id"),
    (
        "RESOURCE_EXHAUSTED",
        "BudgetExceeded, RateLimited, Overloaded",
        "the user's remaining budget is below ε, the principal's --rate-limit is used up, the message is "
        "larger than --max-message-bytes (refused unread by gRPC), or a bound on the calls in flight is "
        "reached (--max-concurrent-rpcs, --max-inflight-bytes, --heavy-queue, --heavy-per-principal, "
        "--max-health-watches, --max-streaming-calls, or the principal's --principal-share of one); retry later",
    ),
    (
        "DEADLINE_EXCEEDED",
        "ReceiveTimeout",
        "the request's message did not arrive within --receive-timeout seconds of its headers, or a stream "
        "(reflection, Health/Watch) passed no message for --stream-idle-timeout seconds",
    ),
    (
        "ALREADY_EXISTS",
        "RequestConflict",
        "a request_id reused with other parameters (or answered under another fingerprint key)",
    ),
    (
        "UNAVAILABLE",
        "LedgerUnavailable, Interrupted",
        "the PostgreSQL ledger does not answer, or no pool connection within --ledger-connect-timeout (5 s), or "
        "the server's draw process ended during the call's draw (a new one serves the retry); a Select, SelectBatch or "
        "Recommend is retried with the same request_id, a GetBudget later",
    ),
    ("UNIMPLEMENTED", "(by gRPC)", "an RPC the server does not serve, e.g. grpc.reflection.v1"),
    ("INTERNAL", "any other exception", "a bug: the message is withheld and the stack logged"),
)
