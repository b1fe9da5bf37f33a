"""`recsvc multiselect`: the multi-selection device on the command line (see recsvc/app/cli.py for
the registration contract). The history never leaves this process: only its noisy embedding does.

There is no --request-id: each run draws a fresh signal, and a second run under a request_id the
server has seen would show it a second, independent signal of the history (which it refuses, but
only after seeing it). Within a run, gRPC retries resend the same bytes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from recsvc.service.cli import Connection, call, print_json
from recsvc.service.config import COUNT, POSITIVE
from recsvc.settings import OneOf, add_arguments, from_namespace, setting


@dataclass(frozen=True, kw_only=True)
class MultiSelect:
    """`multiselect`'s own flags (the connection's are `Connection`)."""

    bundle: Path = setting(
        unit="dir",
        help="the client bundle: the client/ directory of the artifact the server serves, e.g. artifacts/ml-100k/client",
    )
    user: str = setting("", help="user id charged the declared ε (default: none, nothing is charged)")
    history: tuple[str, ...] = setting(
        default_factory=list, nargs="*", unit="item_id", help="the private history's item ids"
    )
    epsilon: float = setting(help="the local ε of the device's noise (declared, charged)", check=POSITIVE)
    k: int = setting(10, help="items the server returns (at most its max_multiselect_k)", check=COUNT)
    signal: str = setting(
        "code",
        help="what the device sends: its code by randomised response (default) or the lattice signal",
        check=OneOf(("code", "lattice")),
    )


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser(
        "multiselect",
        help="private recommendation where the server never sees the history (multi-selection)",
        description="Score the client bundle's codebook with the history, send only the best item's index "
        "by exactly local ε-DP randomised response to MultiSelect (or, with --signal lattice, the "
        "embedding's lattice signal), and keep the best of the k answers by the true scores, locally. "
        "Prints the local choice and the k items as JSON.",
    )
    add_arguments(m, Connection)
    add_arguments(m, MultiSelect)
    m.set_defaults(func=run_multiselect)


def run_multiselect(args: argparse.Namespace) -> int:
    from recsvc.device import Device

    flags = from_namespace(MultiSelect, args)
    device = Device.load(flags.bundle)
    r = call(
        args,
        lambda client: client.multiselect(
            flags.user, flags.history, flags.epsilon, flags.k, device=device, signal=flags.signal
        ),
    )
    return print_json(
        {
            "item_id": r.item_id,
            "item_ids": r.item_ids,
            "epsilon_spent": r.epsilon_spent,
            "budget_remaining": r.budget_remaining,
            "charged": r.charged,
            "replayed": r.replayed,
            "request_id": r.request_id,
        }
    )
