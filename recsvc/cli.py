"""The one ``recsvc`` command. Each part registers its own subcommands.

A registering module exposes ``register(subparsers) -> None`` and sets ``func`` on each of
its parsers via ``set_defaults(func=...)``; ``func(args) -> int`` is the exit code. Heavy
imports stay inside ``func`` so that ``recsvc --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Order here is the order in `recsvc --help`.
COMMAND_MODULES = (
    "data_prep.cli",  # prep
    "eval.cli",  # eval, eval-synthetic
    "recsvc.service.cli",  # serve, select, budget
    "recsvc.mechanisms.cli",  # mechanisms
    "recsvc.demo",  # demo
)


class UserError(ValueError):
    """Raised for bad input: printed as one clear line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recsvc",
        description="Differentially private item selection for recommenders.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # Dask's cluster start/stop chatter drowns the results; distributed reads this when
        # it is first imported (by an engine), and then configures its own loggers from it.
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: one clear line, no traceback. ArtifactError and mechanism errors are ValueErrors.
        print(f"recsvc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
