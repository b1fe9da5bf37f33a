"""`recsvc serve`, `recsvc wait-ready`, `recsvc select`, `recsvc budget`, and `recsvc ledger` from :mod:`.ledger_cli` (see
recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from recsvc.checks import check_epsilon, check_regular_file
from recsvc.mechanisms import MECHANISMS, add_param_arguments, params_from_namespace
from recsvc.service.config import CANDIDATE_MECHANISMS, PARAMS, ServerConfig, default
from recsvc.service.ledger_cli import WINDOW_HELP, ledger_arg, register_ledger

DEFAULT_TARGET = "127.0.0.1:50051"
WAIT_READY_S = 60.0  # `wait-ready`'s default: a cold start compiles the numba kernels (≈ 30 s on 2 cores)
POLL_S = 0.1  # between two health checks of `wait-ready`


# The bounds on what calls in flight may hold (SECURITY.md, "Admission"): flag, type, help.
ADMISSION_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--max-num-candidates", int, "largest num_candidates of a two-stage Recommend (its private top-m)"),
    ("--heavy-queue", int, "heavy calls (above --heavy-draws) queued at once per worker; more: RESOURCE_EXHAUSTED"),
    ("--heavy-per-principal", int, "heavy calls one principal may have queued; more: RESOURCE_EXHAUSTED"),
    ("--max-concurrent-rpcs", int, "authenticated calls in flight per worker; more: RESOURCE_EXHAUSTED"),
    ("--max-streams-per-connection", int, "HTTP/2 streams one connection may open at once"),
    ("--max-inflight-bytes", int, "request bytes of the calls in flight per worker; more: RESOURCE_EXHAUSTED"),
    (
        "--receive-timeout",
        float,
        "seconds from a call's headers to its whole request message; later: DEADLINE_EXCEEDED",
    ),
    ("--idle-timeout", float, "seconds a connection without calls stays open"),
    ("--keepalive-time", float, "seconds between the server's pings on a quiet connection"),
    ("--keepalive-timeout", float, "seconds a ping may go unanswered before the connection is closed"),
    ("--min-ping-interval", float, "least seconds between a client's pings (faster ones end the connection)"),
    ("--max-health-watches", int, "Health/Watch streams open at once per worker (Check is unbounded)"),
    (
        "--max-streaming-calls",
        int,
        "authenticated streaming calls (server reflection) open at once per worker, apart from "
        "--max-concurrent-rpcs; more: RESOURCE_EXHAUSTED",
    ),
    (
        "--stream-idle-timeout",
        float,
        "seconds a stream (reflection, Health/Watch) may pass no message; then it is ended (DEADLINE_EXCEEDED)",
    ),
    (
        "--principal-share",
        float,
        "fraction of --max-concurrent-rpcs, --max-inflight-bytes, --max-health-watches and --max-streaming-calls "
        "one principal may hold (anonymous callers: one per peer address; a principal holding none is "
        "always admitted within the total); more: RESOURCE_EXHAUSTED",
    ),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the private-selection gRPC server",
        description="Serve PrivateSelection (gRPC) over an artifact directory, with a privacy ledger.",
    )
    p.add_argument("--artifacts", type=Path, required=True, help="artifact directory, e.g. artifacts/ml-100k")
    p.add_argument("--host", default=default("host"))
    p.add_argument("--port", type=int, default=default("port"), help="0 picks a free port (single worker)")
    p.add_argument(
        "--ledger",
        type=ledger_arg,
        default=default("ledger"),
        help="privacy ledger: an SQLite file (created if missing) or a PostgreSQL URL "
        "postgresql://USER@HOST:PORT/DB shared by replicas (prepare it with `recsvc ledger init`)",
    )
    p.add_argument(
        "--ledger-pool",
        type=int,
        default=default("ledger_pool"),
        help="PostgreSQL connections per process (default %(default)s)",
    )
    for flag, what in (
        ("lock", "lock_timeout: the longest a charge waits for a lock another session holds (then UNAVAILABLE"),
        ("statement", "statement_timeout: the longest a ledger statement runs (then UNAVAILABLE"),
        (
            "idle",
            "idle_in_transaction_session_timeout: the server ends a ledger session that sits this long inside a "
            "transaction, e.g. a frozen replica's, releasing its rows (its charge rolled back",
        ),
        (
            "connect",
            "replica's own wait for a pooled connection, to connect, or for an answer over a silent link (a "
            "partition), and how long a lost connection is retried (then UNAVAILABLE",
        ),
    ):
        p.add_argument(
            f"--ledger-{flag}-timeout",
            type=float,
            default=default(f"ledger_{flag}_timeout"),
            metavar="SECONDS",
            help=f"PostgreSQL {what}, nothing spent; default %(default)s)",
        )
    p.add_argument(
        "--fingerprint-key",
        type=Path,
        default=default("fingerprint_key"),
        metavar="FILE",
        help="HMAC key of the request fingerprints (default: <ledger>.key, created with mode 0600 "
        "on first start; never stored in the ledger)",
    )
    p.add_argument("--budget", type=float, default=default("budget"), help="per-user ε budget (basic composition)")
    p.add_argument("--budget-window", default=default("budget_window"), metavar="WINDOW", help=WINDOW_HELP)
    p.add_argument(
        "--default-mechanism", default=default("default_mechanism"), help="used when a request names no mechanism"
    )
    p.add_argument(
        "--default-candidate-mechanism",
        default=default("default_candidate_mechanism"),
        help=f"the one-shot top-k mechanism ({', '.join(CANDIDATE_MECHANISMS)}) of a two-stage Recommend's "
        "private top-m when the request names none (default %(default)s)",
    )
    p.add_argument(
        "--auto-threshold",
        type=float,
        default=default("auto_threshold"),
        help="|median population Spearman| above which auto picks gem/mgem",
    )
    p.add_argument(
        "--max-candidates",
        type=int,
        default=default("max_candidates"),
        help="most candidates per Select request (default %(default)s)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=default("max_batch"),
        help="most requests per SelectBatch call (default %(default)s)",
    )
    p.add_argument(
        "--max-batch-candidates",
        type=int,
        default=default("max_batch_candidates"),
        help="most candidates in all the requests of one SelectBatch call, a request's being its largest "
        "count of candidates, item_ids, scores or item_rows (default %(default)s)",
    )
    p.add_argument(
        "--min-epsilon",
        type=float,
        default=default("min_epsilon"),
        help="least ε a request may ask for, so one user stores at most --budget / --min-epsilon answers "
        "per budget window (default %(default)s; 0: no floor but the ledger's unit, 1e-12)",
    )
    p.add_argument(
        "--max-history",
        type=int,
        default=default("max_history"),
        help="most history entries per Recommend request (default %(default)s)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=default("max_message_bytes"),
        help="largest request message accepted, in bytes (default %(default)s = 16 MiB)",
    )
    p.add_argument(
        "--max-slate",
        type=int,
        default=default("max_slate"),
        help="largest k (items per answer) on Select and Recommend (default %(default)s)",
    )
    p.add_argument(
        "--max-multiselect-k",
        type=int,
        default=default("max_multiselect_k"),
        help="largest k (items per answer) on MultiSelect (default %(default)s)",
    )
    p.add_argument(
        "--min-candidates",
        type=int,
        default=default("min_candidates"),
        help="Recommend's public floor: least m of a two-stage request's private top-m (default "
        "%(default)s; the whole catalog if smaller). Without a candidate stage Recommend "
        "always selects over the full catalog",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=default("workers"),
        help="processes sharing the port (SO_REUSEPORT) and the ledger",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=default("threads"),
        help="request threads per worker: they decode, check and charge calls (a Select alone on the server runs on the event loop instead; default %(default)s)",
    )
    p.add_argument(
        "--heavy-draws",
        type=int,
        default=default("heavy_draws"),
        help="expected random draws (random stopping: about 1/gamma) above which a sample is drawn "
        "by the low-priority pool",
    )
    p.add_argument(
        "--heavy-draw-threads",
        type=int,
        default=default("heavy_draw_threads"),
        help="threads of that pool per worker (lowest CPU priority; each draw may take tens of MB)",
    )
    for flag, kind, text in ADMISSION_FLAGS:
        p.add_argument(
            flag, type=kind, default=default(flag[2:].replace("-", "_")), help=text + " (default %(default)s)"
        )
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM); enables TLS")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    p.add_argument("--client-ca", type=Path, help="CA (PEM) for client certificates; enables mTLS")
    p.add_argument(
        "--token-file",
        type=Path,
        help="bearer tokens, lines '<token> <scope>' (scope admin, service or user:<user_id>; "
        "a token alone means service); enables token auth",
    )
    p.add_argument(
        "--client-scopes",
        type=Path,
        help="with --client-ca: lines 'subject:<RFC 2253 subject> <scope>' or '<type>:<SAN> <scope>' (type "
        "dns, uri, email or ip) mapping client certificates to scopes (see SECURITY.md)",
    )
    p.add_argument(
        "--allow-plaintext-tokens",
        action="store_true",
        help="accept --token-file without TLS on a non-loopback --host (a trusted proxy terminates TLS)",
    )
    p.add_argument(
        "--rate-limit",
        type=float,
        default=default("rate_limit"),
        help="requests/s per principal and worker, a SelectBatch counting each item (0: no limit)",
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", default=default("metrics_host"))
    not_dp = ", ".join(n for n, m in MECHANISMS.items() if not m.private)
    p.add_argument("--allow-non-private", action="store_true", help=f"accept {not_dp} (NOT differentially private)")
    p.add_argument("--grace", type=float, default=default("grace"), help="seconds in-flight calls get on SIGTERM")
    p.add_argument(
        "--drain-delay",
        type=float,
        default=default("drain_delay"),
        help="seconds of NOT_SERVING before the port closes",
    )
    p.add_argument(
        "--ready-file",
        type=Path,
        default=default("ready_file"),
        metavar="FILE",
        help="written (whole, at once) with HOST:PORT when the server listens, removed when it stops; "
        "scripts wait for it, or run `recsvc wait-ready`",
    )
    p.set_defaults(func=run_serve)

    w = sub.add_parser(
        "wait-ready",
        help="wait until a server answers health SERVING",
        description="Polls the gRPC health service of --target until it answers SERVING (exit 0), e.g. "
        "after starting `recsvc serve` in the background; after --timeout seconds without, one line "
        "on stderr and exit 2.",
    )
    w.add_argument("--target", default=DEFAULT_TARGET, help=f"HOST:PORT (default {DEFAULT_TARGET})")
    w.add_argument("--tls-ca", type=Path, help="CA (PEM) to verify the server; enables TLS")
    w.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mTLS")
    w.add_argument("--tls-key", type=Path, help="client key (PEM) for mTLS")
    w.add_argument("--timeout", type=float, default=WAIT_READY_S, help="seconds to wait in all")
    w.set_defaults(func=run_wait_ready)

    s = sub.add_parser(
        "select",
        help="ask a running server for one private selection",
        description="Send one Select request and print the answer as JSON.",
    )
    _client_args(s)
    s.add_argument("--user", required=True, help="user id (the budget is charged to it)")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--candidates", type=Path, help="CSV with columns item_id,score (header optional)")
    g.add_argument("--candidate", action="append", metavar="ID:SCORE", help="one candidate; repeat")
    s.add_argument("--mechanism", default="", help="mechanism name or 'auto' (default: the server's default)")
    s.add_argument("--epsilon", type=float, required=True)
    s.add_argument("--request-id", help="idempotency key; reuse it to retry safely (default: a fresh uuid)")
    add_param_arguments(s)  # --beta, --gamma, --corr-budget-fraction (unset: the mechanism's default)
    s.add_argument(
        "--k",
        type=int,
        default=0,
        help="slate size: k distinct items in selection order, ε charged once (default: one item)",
    )
    s.set_defaults(func=run_select)

    register_ledger(sub)

    b = sub.add_parser("budget", help="show a user's privacy budget on a running server")
    _client_args(b)
    b.add_argument("--user", required=True)
    b.set_defaults(func=run_budget)


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"HOST:PORT (default {DEFAULT_TARGET})")
    p.add_argument("--token-file", type=Path, help="file whose first token is sent as 'authorization: Bearer'")
    p.add_argument("--tls-ca", type=Path, help="CA (PEM) to verify the server; enables TLS")
    p.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mTLS")
    p.add_argument("--tls-key", type=Path, help="client key (PEM) for mTLS")
    p.add_argument("--timeout", type=float, default=30.0)


def run_serve(args: argparse.Namespace) -> int:
    from recsvc.service.workers import serve

    return serve(
        ServerConfig.of(args.artifacts, **{name: getattr(args, name) for name in PARAMS if hasattr(args, name)})
    )


def run_wait_ready(args: argparse.Namespace) -> int:
    import time

    import grpc

    from recsvc.service.client import Client

    check_target(args.target)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    deadline = time.monotonic() + args.timeout
    status = "no answer"
    while (left := deadline - time.monotonic()) > 0:
        # A fresh channel each time: a channel that failed to connect backs off for up to 2 minutes.
        with Client(args.target, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, timeout=left) as c:
            c.timeout = min(1.0, left)  # one check; the loop waits for the rest
            try:
                status = c.health()
            except grpc.RpcError as exc:
                status = exc.code().name
        if status == "SERVING":
            return 0
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
    raise ValueError(
        f"--target {args.target} did not answer health SERVING within {args.timeout:g}s (last: {status}); "
        "expected a running `recsvc serve` there"
    )


def parse_candidate(text: str) -> tuple[str, float]:
    item, sep, score = text.rpartition(":")
    if not sep or not item:
        raise ValueError(f"--candidate {text!r}: expected ITEM_ID:SCORE, e.g. 50:0.93")
    try:
        return item, float(score)
    except ValueError:
        raise ValueError(f"--candidate {text!r}: the score is not a number; expected ITEM_ID:SCORE") from None


def read_candidates_csv(path: Path) -> list[tuple[str, float]]:
    """Rows `item_id,score`; a first row whose score is not a number is taken as the header."""
    check_regular_file("candidates file", path, "a CSV of item_id,score")
    try:
        return _parse_candidates(path)
    except UnicodeDecodeError:
        raise ValueError(f"candidates file {path} is not UTF-8 text; expected a CSV of item_id,score") from None


def _parse_candidates(path: Path) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 2:
                raise ValueError(f"{path}:{line}: expected 2 columns item_id,score, got {len(row)}")
            try:
                out.append((row[0].strip(), float(row[1])))
            except ValueError:
                if line == 1 and not out:
                    continue  # header
                raise ValueError(f"{path}:{line}: score is not a number; expected item_id,score") from None
    if not out:
        raise ValueError(f"{path} has no candidate rows; expected lines item_id,score")
    return out


def check_target(target: str) -> str:
    """HOST:PORT with a port in 1..65535 ([v6]:PORT for IPv6); grpc would silently wrap 99999."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--target {target!r}: expected HOST:PORT with a port in 1..65535, e.g. {DEFAULT_TARGET}")
    return target


def _client(args: argparse.Namespace) -> Any:
    from recsvc.service.auth import read_token
    from recsvc.service.client import Client

    check_target(args.target)  # --timeout is checked by Client itself, before any call
    token = read_token(args.token_file) if args.token_file else None
    return Client(
        args.target, token=token, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, timeout=args.timeout
    )


class RpcFailure(ValueError):
    """The server refused the call; recsvc/app/cli.py prints it (a ValueError) as one line with exit code 2."""


def _rpc_error(exc: Any) -> Exception:
    return RpcFailure(f"{exc.code().name}: {exc.details()}")


def run_select(args: argparse.Namespace) -> int:
    import grpc

    cands = read_candidates_csv(args.candidates) if args.candidates else [parse_candidate(c) for c in args.candidate]
    check_epsilon(args.epsilon, "--epsilon")
    if args.k < 0:
        raise ValueError(f"--k must be >= 0 (0 or 1: one item; k: a k-item slate), got {args.k}")
    with _client(args) as client:
        try:
            r = client.select(
                args.user,
                cands,
                mechanism=args.mechanism,
                epsilon=args.epsilon,
                request_id=args.request_id,
                k=args.k,
                **params_from_namespace(args),
            )
        except grpc.RpcError as exc:
            raise _rpc_error(exc) from None
    json.dump(
        {
            "item_id": r.item_id,
            "item_ids": list(r.item_ids),
            "mechanism": r.mechanism,
            "epsilon_spent": r.epsilon_spent,
            "budget_remaining": r.budget_remaining,
            "request_id": r.request_id,
            "replayed": r.replayed,
        },
        sys.stdout,
    )
    print()
    return 0


def run_budget(args: argparse.Namespace) -> int:
    import grpc

    with _client(args) as client:
        try:
            r = client.budget(args.user)
        except grpc.RpcError as exc:
            raise _rpc_error(exc) from None
    json.dump(
        {
            "user_id": r.user_id,
            "budget": r.budget,
            "spent": r.spent,
            "remaining": r.remaining,
            "requests": r.requests,
            "window_start": _utc(r.window_start_unix),
            "window_end": _utc(r.window_end_unix),
            "window_start_unix": r.window_start_unix,
            "window_end_unix": r.window_end_unix,
        },
        sys.stdout,
    )
    print()
    return 0


def _utc(unix: int) -> str | None:
    """ISO 8601 UTC of a window bound; None for a lifetime budget (0)."""
    from datetime import UTC, datetime

    return None if unix == 0 else datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")
