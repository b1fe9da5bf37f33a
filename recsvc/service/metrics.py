"""Prometheus metrics of the service. Labels never carry user ids, item ids or scores.

With ``--workers N`` each worker writes to ``PROMETHEUS_MULTIPROC_DIR`` (set by the parent
before it forks) and the parent serves the aggregate; see :func:`serve_metrics_http`.
"""

from __future__ import annotations

import os
from collections import Counter as Tally
from collections import defaultdict
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess, start_http_server

from recsvc.checks import ParamError
from recsvc.service.codec import Framed
from recsvc.service.config import host_port
from recsvc.v1 import selection_pb2 as pb

REQUESTS = Counter(
    "recsvc_requests",
    "Selection requests by RPC method, mechanism actually used and gRPC status.",
    ["method", "mechanism", "status"],
)
LATENCY = Histogram(
    "recsvc_request_seconds",
    "Server-side latency of PrivateSelection RPCs.",
    ["method"],
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
EPSILON_SPENT = Counter(
    "recsvc_epsilon_spent",
    "Privacy budget charged to the ledger (replays are not counted), by mechanism.",
    ["mechanism"],
)
REPLAYS = Counter("recsvc_replays", "Retried requests answered from the ledger without spending.")
REFUSALS = Counter(
    "recsvc_gate_refusals",
    "Calls the gate refused before reading or decoding them, by the pool (the flag of its bound: "
    "--max-concurrent-rpcs, --max-inflight-bytes, --max-health-watches, --max-streaming-calls) and the "
    "limit met: 'total' (the pool is full) or 'principal' (the caller's --principal-share).",
    ["pool", "limit"],
)
RELOCKED = Counter(
    "recsvc_ledger_relocked",
    "PostgreSQL ledger: drawn charges decided under the user's row lock because the account moved "
    "after their pre-check read it (another request or replica charged the user meanwhile).",
)


# The label sets are few and fixed (methods × mechanisms × status codes): bind each child once
# instead of resolving labels on every request.
@cache
def requests(method: str, mechanism: str, status: str) -> Counter:
    return REQUESTS.labels(method, mechanism, status)


@cache
def latency(method: str) -> Histogram:
    return LATENCY.labels(method)


@cache
def refusals(pool: str, limit: str) -> Counter:
    return REFUSALS.labels(pool, limit)


@cache
def epsilon_spent(mechanism: str) -> Counter:
    return EPSILON_SPENT.labels(mechanism)


def serve_metrics_http(port: int, addr: str = "127.0.0.1") -> Any:
    """Serves /metrics on ``addr:port`` (a thread); returns the HTTP server (``.server_port``,
    ``.shutdown()``). A port that cannot be bound is a ValueError naming it."""
    try:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            server, _ = start_http_server(port, addr=addr, registry=registry)
        else:
            server, _ = start_http_server(port, addr=addr)
    except (OSError, OverflowError) as exc:  # socket.gaierror is an OSError
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ParamError(
            "cannot serve metrics on {address} ({reason}); expected {metrics_port} to be a free port "
            "in 0..65535 (not {port}) and {metrics_host} an address of this machine",
            address=host_port(addr, port),
            reason=reason,
        ) from None
    return server


def count_answer(response: Any) -> str:
    """Counts what an answer spent (or that it replayed); returns the mechanism label of the call."""
    if isinstance(response, pb.SelectResponse):
        if response.replayed:
            REPLAYS.inc()
        else:
            epsilon_spent(response.mechanism).inc(response.epsilon_spent)
        return response.mechanism
    if isinstance(response, pb.MultiSelectResponse):
        if response.replayed:
            REPLAYS.inc()
        elif response.charged:
            epsilon_spent("multiselect").inc(response.epsilon_spent)
        return "multiselect"
    if isinstance(response, Framed):
        _count_items(response.outcomes)
    return ""


def _count_items(outcomes: list[tuple[str, str, float, bool]]) -> None:
    """A batch's items (see :class:`recsvc.service.codec.Framed`), counted as SelectBatch.item calls."""
    counts: Tally[tuple[str, str]] = Tally()
    spent: defaultdict[str, float] = defaultdict(float)
    replays = 0
    for mechanism, status, epsilon, replay in outcomes:
        counts[mechanism, status] += 1
        if replay:
            replays += 1
        elif epsilon:
            spent[mechanism] += epsilon
    for (mechanism, status), n in counts.items():
        requests("SelectBatch.item", mechanism, status).inc(n)
    for mechanism, eps in spent.items():
        epsilon_spent(mechanism).inc(eps)
    if replays:
        REPLAYS.inc(replays)
