"""`recsvc ledger init|set-budget|migrate|export`: a privacy ledger's life outside the server (see
recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recsvc.ledger import is_postgres
from recsvc.service.config import ServerConfig, default

WINDOW_HELP = (
    "'lifetime' (default: --budget is ε per user over all time) or Nd, e.g. 1d, 7d, 30d: a renewable "
    "budget, --budget ε per user per N-day window aligned to the Unix epoch in UTC (1d starts at 00:00 "
    "UTC; 7d on Thursdays). The guarantee is then ε per window, NOT over all time: over T windows a "
    "user's data may be exposed up to T·ε. Hours are not accepted. Fixed when the ledger is created; "
    "every replica must use the same window"
)


def register_ledger(sub: argparse._SubParsersAction) -> None:
    led = sub.add_parser(
        "ledger",
        help="prepare, migrate or export a privacy ledger (PostgreSQL or SQLite)",
        description="Create a ledger and store the settings every replica must share, "
        "apply pending schema migrations, or export its charges for an audit.",
    )
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    init = led_sub.add_parser("init", help="create the ledger (idempotent; refuses other settings)")
    init.add_argument("--ledger", type=ledger_arg, required=True, help="PostgreSQL URL or SQLite file")
    init.add_argument("--budget", type=float, default=default("budget"), help="per-user ε budget (basic composition)")
    init.add_argument("--budget-window", default=default("budget_window"), metavar="WINDOW", help=WINDOW_HELP)
    init.add_argument(
        "--fingerprint-key",
        type=Path,
        metavar="FILE",
        help="fingerprint key file, created with mode 0600 if missing (required for PostgreSQL; "
        "SQLite default: <ledger>.key); copy it to every replica",
    )
    init.set_defaults(func=run_ledger_init)
    sb = led_sub.add_parser(
        "set-budget",
        help="change the per-user budget the ledger is pinned to; the change is recorded in the ledger",
        description="Re-pin the ledger to a new per-user ε budget and record the change (time, old and "
        "new budget, who) in the ledger; `recsvc ledger export` includes the record. Running processes "
        "keep their budget until restarted with the new --budget.",
    )
    sb.add_argument("--ledger", type=ledger_arg, required=True, help="PostgreSQL URL or SQLite file")
    sb.add_argument("--budget", type=float, required=True, help="the new per-user ε budget")
    sb.set_defaults(func=run_ledger_set_budget)
    mig = led_sub.add_parser("migrate", help="apply pending schema migrations of a PostgreSQL ledger")
    mig.add_argument("--ledger", type=ledger_arg, required=True, help="PostgreSQL URL")
    mig.set_defaults(func=run_ledger_migrate)
    exp = led_sub.add_parser(
        "export",
        help="write one Parquet row per charge (user_id, request_id, mechanism, epsilon, time) for an audit",
        description="Stream every charge of a ledger into a Parquet file: user_id, request_id, "
        "mechanism, epsilon, time (UTC). No fingerprints, scores, items or answers.",
    )
    exp.add_argument("--ledger", type=ledger_arg, required=True, help="PostgreSQL URL or SQLite file")
    exp.add_argument("--out", type=Path, required=True, help="Parquet file to write, e.g. charges.parquet")
    exp.add_argument("--force", action="store_true", help="replace --out if it exists")
    exp.set_defaults(func=run_ledger_export)


def ledger_arg(text: str) -> Path | str:
    """A PostgreSQL URL stays a string (Path would fold its '//'); anything else is a file path."""
    return text if is_postgres(text) else Path(text)


def _ledger_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig.of(
        Path("."),
        ledger=args.ledger,
        budget=args.budget,
        budget_window=args.budget_window,
        fingerprint_key=args.fingerprint_key,
    ).check()


def run_ledger_init(args: argparse.Namespace) -> int:
    from recsvc.ledger import open_ledger

    config = _ledger_config(args).ledger
    store = open_ledger(
        config.location,
        config.budget,
        config.key_path,
        pool_size=1,
        create=True,
        window=config.window,
    )
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
    where = describe_ledger(args.ledger)
    print(f"recsvc ledger: wrote {n} charge(s) of {where} to {args.out}")
    return 0


def describe_ledger(ledger: Path | str) -> str:
    """A ledger as messages name it: host:port/db of a PostgreSQL URL (never the password), or the path."""
    if is_postgres(ledger):
        from recsvc.ledger.postgres.schema import describe

        return describe(str(ledger))
    return str(ledger)
