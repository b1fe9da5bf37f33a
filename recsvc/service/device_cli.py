"""`recsvc multiselect`: the multi-selection device on the command line (see recsvc/app/cli.py for
the registration contract). The history never leaves this process: only its noisy embedding does.

There is no --request-id: each run draws a fresh signal, and a second run under a request_id the
server has seen would show it a second, independent signal of the history (which it refuses, but
only after seeing it). Within a run, gRPC retries resend the same bytes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recsvc.checks import check_epsilon
from recsvc.service.cli import _client, _client_args, _rpc_error

DEFAULT_K = 10


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser(
        "multiselect",
        help="private recommendation where the server never sees the history (multi-selection)",
        description="Score the client bundle's codebook with the history, send only the best item's index "
        "by exactly local ε-DP randomised response to MultiSelect (or, with --signal lattice, the "
        "embedding's lattice signal), and keep the best of the k answers by the true scores, locally. "
        "Prints the local choice and the k items as JSON.",
    )
    _client_args(m)
    m.add_argument(
        "--bundle",
        type=Path,
        required=True,
        metavar="DIR",
        help="the client bundle: the client/ directory of the artifact the server serves, e.g. "
        "artifacts/ml-100k/client",
    )
    m.add_argument("--user", default="", help="user id charged the declared ε (default: none, nothing is charged)")
    m.add_argument("--history", nargs="*", default=[], metavar="ITEM_ID", help="the private history's item ids")
    m.add_argument("--epsilon", type=float, required=True, help="the local ε of the device's noise (declared, charged)")
    m.add_argument("--k", type=int, default=DEFAULT_K, help="items the server returns (at most its max_multiselect_k)")
    m.add_argument(
        "--signal",
        choices=("code", "lattice"),
        default="code",
        help="what the device sends: its code by randomised response (default) or the lattice signal",
    )
    m.set_defaults(func=run_multiselect)


def run_multiselect(args: argparse.Namespace) -> int:
    import grpc

    from recsvc.device import Device

    check_epsilon(args.epsilon, "--epsilon")
    if args.k < 1:
        raise ValueError(f"--k must be >= 1 (the number of items the server returns), got {args.k}")
    device = Device.load(args.bundle)
    with _client(args) as client:
        try:
            r = client.multiselect(args.user, args.history, args.epsilon, args.k, device=device, signal=args.signal)
        except grpc.RpcError as exc:
            raise _rpc_error(exc) from None
    json.dump(
        {
            "item_id": r.item_id,
            "item_ids": r.item_ids,
            "epsilon_spent": r.epsilon_spent,
            "budget_remaining": r.budget_remaining,
            "charged": r.charged,
            "replayed": r.replayed,
            "request_id": r.request_id,
        },
        sys.stdout,
    )
    print()
    return 0
