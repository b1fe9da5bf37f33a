"""`recsvc ledger init|set-budget|migrate|export`: a privacy ledger's life outside the server (see
recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from recsvc.ledger import is_postgres
from recsvc.service.config import LedgerSettings, ServerConfig, ledger_arg
from recsvc.settings import add_arguments, setting


@dataclass(frozen=True)
class LedgerCommand:
    """The `ledger` subcommands' own flags; `init` takes the rest from the server's (LedgerSettings)."""

    ledger: Path | str = setting(
        type=ledger_arg, help="the ledger: a PostgreSQL URL postgresql://USER@HOST:PORT/DB or an SQLite file"
    )
    new_budget: float = setting(name="budget", help="the new per-user ε budget")
    out: Path = setting(unit="file", help="Parquet file to write, e.g. charges.parquet")
    force: bool = setting(False, help="replace --out if it exists")


def register_ledger(sub: argparse._SubParsersAction) -> None:
    led = sub.add_parser(
        "ledger",
        help="prepare, migrate or export a privacy ledger (PostgreSQL or SQLite)",
        description="Create a ledger and store the settings every replica must share, "
        "apply pending schema migrations, or export its charges for an audit.",
    )
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    init = led_sub.add_parser("init", help="create the ledger (idempotent; refuses other settings)")
    add_arguments(init, LedgerCommand, only=["ledger"])
    add_arguments(init, LedgerSettings, only=["budget", "budget_window", "fingerprint_key"])
    init.set_defaults(func=run_ledger_init)
    sb = led_sub.add_parser(
        "set-budget",
        help="change the per-user budget the ledger is pinned to; the change is recorded in the ledger",
        description="Re-pin the ledger to a new per-user ε budget and record the change (time, old and "
        "new budget, who) in the ledger; `recsvc ledger export` includes the record. Running processes "
        "keep their budget until restarted with the new --budget.",
    )
    add_arguments(sb, LedgerCommand, only=["ledger", "budget"])
    sb.set_defaults(func=run_ledger_set_budget)
    mig = led_sub.add_parser("migrate", help="apply pending schema migrations of a PostgreSQL ledger")
    add_arguments(mig, LedgerCommand, only=["ledger"])
    mig.set_defaults(func=run_ledger_migrate)
    exp = led_sub.add_parser(
        "export",
        help="write one Parquet row per charge (user_id, request_id, mechanism, epsilon, time) for an audit",
        description="Stream every charge of a ledger into a Parquet file: user_id, request_id, "
        "mechanism, epsilon, time (UTC). No fingerprints, scores, items or answers.",
    )
    add_arguments(exp, LedgerCommand, only=["ledger", "out", "force"])
    exp.set_defaults(func=run_ledger_export)


def _ledger_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig.of(
        Path("."),
        ledger=args.ledger,
        budget=args.budget,
        budget_window=args.budget_window,
        fingerprint_key=args.fingerprint_key,
    ).check()


def run_ledger_init(args: argparse.Namespace) -> int:
    config = _ledger_config(args).ledger
    store = config.open(pool_size=1, create=True)
    store.close()
    where = getattr(store, "where", str(config.location))
    print(
        f"recsvc ledger: {where} is ready (budget ε={config.budget:g} per user {config.window.per}, "
        f"fingerprint key {config.key_path})"
    )
    return 0


def run_ledger_set_budget(args: argparse.Namespace) -> int:
    from recsvc.ledger import set_budget
    from recsvc.ledger.units import format_units

    where, change = set_budget(args.ledger, args.budget)
    if change is None:
        print(f"recsvc ledger: {where} budget unchanged (ε={args.budget:g} per user)")
        return 0
    old, new = format_units(change.old_units), format_units(change.new_units)
    print(
        f"recsvc ledger: {where} budget ε={old} -> ε={new} per user, recorded (by {change.changed_by}); "
        f"restart every process on it with --budget {new}"
    )
    return 0


def run_ledger_migrate(args: argparse.Namespace) -> int:
    from recsvc.ledger.postgres.schema import migrate_url

    if not is_postgres(args.ledger):
        raise ValueError(
            f"--ledger {args.ledger}: an SQLite ledger migrates itself when `recsvc serve` opens it; "
            "expected a PostgreSQL URL postgresql://USER@HOST:PORT/DB"
        )
    where, before, after = migrate_url(args.ledger)
    print(f"recsvc ledger: {where} schema version {before} -> {after}")
    return 0


def run_ledger_export(args: argparse.Namespace) -> int:
    from recsvc.ledger.export import export

    n = export(args.ledger, args.out, force=args.force)
    where = str(args.ledger)
    if is_postgres(args.ledger):
        from recsvc.ledger.postgres.schema import describe

        where = describe(where)  # host:port/db, never the password
    print(f"recsvc ledger: wrote {n} charge(s) of {where} to {args.out}")
    return 0
