"""`recsvc serve`, `recsvc wait-ready`, `recsvc select`, `recsvc budget`, and `recsvc ledger` from :mod:`.ledger_cli` (see
recsvc/app/cli.py for the registration contract). Their settings are declared once, in
:mod:`recsvc.service.config` and in the dataclasses here (:mod:`recsvc.settings`)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from recsvc.checks import check_regular_file
from recsvc.mechanisms import add_param_arguments, params_from_namespace
from recsvc.service.config import BOUND, POSITIVE, ServerConfig
from recsvc.service.ledger_cli import register_ledger
from recsvc.settings import add_arguments, from_namespace, setting

T = TypeVar("T")
DEFAULT_TARGET = "127.0.0.1:50051"
WAIT_READY_S = 60.0  # `wait-ready`'s default: a cold start compiles the numba kernels (≈ 30 s on 2 cores)
POLL_S = 0.1  # between two health checks of `wait-ready`
# `serve`'s flags after --artifacts and --host, in the order --help lists them
SERVE_FLAGS = """port ledger ledger_pool ledger_lock_timeout ledger_statement_timeout ledger_idle_timeout
ledger_connect_timeout fingerprint_key budget budget_window default_mechanism default_candidate_mechanism auto_threshold
max_candidates max_batch max_batch_candidates min_epsilon max_history max_message_bytes max_slate max_multiselect_k
min_candidates workers threads heavy_draws heavy_draw_threads max_num_candidates heavy_queue heavy_per_principal
max_concurrent_rpcs max_streams_per_connection max_inflight_bytes receive_timeout idle_timeout keepalive_time
keepalive_timeout min_ping_interval max_health_watches max_streaming_calls stream_idle_timeout principal_share
tls_cert tls_key client_ca token_file client_scopes allow_plaintext_tokens rate_limit metrics_port metrics_host
allow_non_private grace drain_delay ready_file""".split()  # noqa: SIM905  # words in --help order read better than 56 quoted ones


@dataclass(frozen=True)
class Connection:
    """How a client command reaches the server."""

    target: str = setting(DEFAULT_TARGET, unit="host:port", help="the server's address")
    token_file: Path | None = setting(None, help="file whose first token is sent as 'authorization: Bearer'")
    tls_ca: Path | None = setting(None, help="CA (PEM) to verify the server; enables TLS")
    tls_cert: Path | None = setting(None, help="client certificate (PEM) for mTLS")
    tls_key: Path | None = setting(None, help="client key (PEM) for mTLS")
    timeout: float = setting(30.0, unit="seconds", help="how long each call may take")


@dataclass(frozen=True)
class WaitReady(Connection):
    timeout: float = setting(WAIT_READY_S, unit="seconds", help="how long to wait in all", check=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class Select:
    """`select`'s own flags (`budget` shares --user)."""

    user: str = setting(help="user id: the one charged, or whose budget is shown")
    candidates: Path | None = setting(None, unit="file", help="CSV with columns item_id,score (header optional)")
    candidate: tuple[str, ...] | None = setting(None, unit="id:score", repeat=True, help="one candidate; repeat")
    mechanism: str = setting("", help="mechanism name or 'auto' (default: the server's default)")
    epsilon: float = setting(help="the privacy cost ε of the selection", check=POSITIVE)
    request_id: str | None = setting(None, help="idempotency key; reuse it to retry safely (default: a fresh uuid)")
    k: int = setting(
        0, help="slate size: k distinct items in selection order, ε charged once (0: one item)", check=BOUND
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the private-selection gRPC server",
        description="Serve PrivateSelection (gRPC) over an artifact directory, with a privacy ledger.",
    )
    add_arguments(p, ServerConfig, only=["artifacts", "host", *SERVE_FLAGS])
    p.set_defaults(func=run_serve)

    w = sub.add_parser(
        "wait-ready",
        help="wait until a server answers health SERVING",
        description="Polls the gRPC health service of --target until it answers SERVING (exit 0), e.g. "
        "after starting `recsvc serve` in the background; after --timeout seconds without, one line "
        "on stderr and exit 2.",
    )
    add_arguments(w, WaitReady, skip=["token_file"])
    w.set_defaults(func=run_wait_ready)

    s = sub.add_parser(
        "select",
        help="ask a running server for one private selection",
        description="Send one Select request and print the answer as JSON.",
    )
    add_arguments(s, Connection)
    add_arguments(s, Select, only=["user"])
    g = s.add_mutually_exclusive_group(required=True)
    add_arguments(g, Select, only=["candidates", "candidate"])
    add_arguments(s, Select, only=["mechanism", "epsilon", "request_id"])
    add_param_arguments(s)  # --beta, --gamma, --corr-budget-fraction (unset: the mechanism's default)
    add_arguments(s, Select, only=["k"])
    s.set_defaults(func=run_select)

    register_ledger(sub)

    b = sub.add_parser("budget", help="show a user's privacy budget on a running server")
    add_arguments(b, Connection)
    add_arguments(b, Select, only=["user"])
    b.set_defaults(func=run_budget)


def run_serve(args: argparse.Namespace) -> int:
    from recsvc.service.workers import serve

    return serve(from_namespace(ServerConfig, args))


def run_wait_ready(args: argparse.Namespace) -> int:
    import time

    import grpc

    from recsvc.service.client import Client

    c = from_namespace(WaitReady, args)
    check_target(c.target)
    deadline = time.monotonic() + c.timeout
    status = "no answer"
    while (left := deadline - time.monotonic()) > 0:
        # A fresh channel each time: a channel that failed to connect backs off for up to 2 minutes.
        with Client(c.target, tls_ca=c.tls_ca, tls_cert=c.tls_cert, tls_key=c.tls_key, timeout=left) as client:
            client.timeout = min(1.0, left)  # one check; the loop waits for the rest
            try:
                status = client.health()
            except grpc.RpcError as exc:
                status = exc.code().name
        if status == "SERVING":
            return 0
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
    raise ValueError(
        f"--target {c.target} did not answer health SERVING within {c.timeout:g}s (last: {status}); "
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


def check_target(target: str) -> None:
    """HOST:PORT with a port in 1..65535 ([v6]:PORT for IPv6); grpc would silently wrap 99999."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--target {target!r}: expected HOST:PORT with a port in 1..65535, e.g. {DEFAULT_TARGET}")


class RpcFailure(ValueError):
    """The server refused the call; recsvc/app/cli.py prints it (a ValueError) as one line with exit code 2."""


def call(args: argparse.Namespace, ask: Callable[[Any], T]) -> T:
    """``ask(client)`` on a client of the command's --target; a refusal is an :class:`RpcFailure`."""
    import grpc

    from recsvc.service.auth import read_token
    from recsvc.service.client import Client

    c = from_namespace(Connection, args)
    check_target(c.target)  # --timeout is checked by Client itself, before any call
    token = read_token(c.token_file) if c.token_file else None
    with Client(
        c.target, token=token, tls_ca=c.tls_ca, tls_cert=c.tls_cert, tls_key=c.tls_key, timeout=c.timeout
    ) as client:
        try:
            return ask(client)
        except grpc.RpcError as exc:
            raise RpcFailure(f"{exc.code().name}: {exc.details()}") from None


def print_json(answer: dict[str, Any]) -> int:
    """A client command's answer: one JSON object on stdout; exit code 0."""
    json.dump(answer, sys.stdout)
    print()
    return 0


def run_select(args: argparse.Namespace) -> int:
    flags = from_namespace(Select, args)
    cands = read_candidates_csv(flags.candidates) if flags.candidates else [parse_candidate(c) for c in args.candidate]
    r = call(
        args,
        lambda client: client.select(
            flags.user,
            cands,
            mechanism=flags.mechanism,
            epsilon=flags.epsilon,
            request_id=flags.request_id,
            k=flags.k,
            **params_from_namespace(args),
        ),
    )
    return print_json(
        {
            "item_id": r.item_id,
            "item_ids": list(r.item_ids),
            "mechanism": r.mechanism,
            "epsilon_spent": r.epsilon_spent,
            "budget_remaining": r.budget_remaining,
            "request_id": r.request_id,
            "replayed": r.replayed,
        }
    )


def run_budget(args: argparse.Namespace) -> int:
    r = call(args, lambda client: client.budget(args.user))
    return print_json(
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
        }
    )


def _utc(unix: int) -> str | None:
    """ISO 8601 UTC of a window bound; None for a lifetime budget (0)."""
    from datetime import UTC, datetime

    return None if unix == 0 else datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")
