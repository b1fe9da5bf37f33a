"""Subcommands of this part (see recsvc/cli.py for the registration contract)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    pass
