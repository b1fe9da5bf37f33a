"""Every ``recsvc`` command keeps its flags, their defaults and its refusals (issue 38's
"behaviour unchanged"): the parsers and a set of bad command lines are held to a recording.

For each (sub)command: each option's strings, destination, default, type, choices, arity and
whether it is required, exactly; for each bad command line in :data:`BAD`: exit code 2 and an
error line naming at least the flags the recorded one named. Help text is not held (it may be reworded; tests/architecture/test_cli_help.py
checks that every default is shown). Re-record with
``RECSVC_RECORD_CLI=1 .venv/bin/python -m pytest tests/architecture/test_cli_surface.py`` only
when a change is MEANT to change a command line, and say why in the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from recsvc.app.cli import build_parser, main
from recsvc.app.docs import commands

REFERENCE = Path(__file__).with_name("cli_surface.json")

# Command lines refused before any work starts: a value of the wrong type, out of its range, or
# of an unknown choice, for each command that takes settings.
BAD: tuple[tuple[str, ...], ...] = (
    ("serve", "--artifacts", "/nonexistent", "--threads", "0"),
    ("serve", "--artifacts", "/nonexistent", "--threads", "x"),
    ("serve", "--artifacts", "/nonexistent", "--principal-share", "1.5"),
    ("serve", "--artifacts", "/nonexistent", "--receive-timeout", "-1"),
    ("serve", "--artifacts", "/nonexistent", "--workers", "0"),
    ("serve", "--artifacts", "/nonexistent", "--heavy-draws", "-5"),
    ("prep", "--dataset", "nosuch"),
    ("prep", "--dataset", "synthetic", "--l2", "-1", "--out", "/nonexistent/x"),
    ("prep", "--dataset", "synthetic", "--percentiles", "99", "1", "--out", "/nonexistent/x"),
    ("prep", "--dataset", "synthetic", "--chunk-users", "0", "--out", "/nonexistent/x"),
    ("prep", "--dataset", "synthetic", "--out", "/nonexistent/x", "--seed", "x"),
    ("eval", "--artifacts", "/nonexistent", "--epsilons", "0"),
    ("eval", "--artifacts", "/nonexistent", "--mechanisms", "nosuch"),
    ("eval", "--artifacts", "/nonexistent", "--users", "0"),
    ("eval-synthetic", "--scenario", "nosuch"),
    ("eval-synthetic", "--scenario", "lognormal", "--trials", "0"),
    ("eval-bandit", "--out", "/nonexistent/b", "--seeds", "0"),
    ("eval-bandit", "--out", "/nonexistent/b", "--shift", "60000"),
    ("eval-two-candidates", "--epsilons", "-1"),
    ("eval-two-candidates", "--beta", "2"),
    ("eval-multiselect", "--theory", "--mc-draws", "0"),
    ("eval-feature-selection", "--epsilons", "0"),
    ("eval-feature-selection", "--neighbouring", "nosuch"),
    ("select", "--user", "u", "--epsilon", "x"),
    ("select", "--user", "u", "--epsilon", "1", "--k", "x"),
    ("budget",),
    ("multiselect", "--bundle", "/nonexistent", "--epsilon", "x"),
    ("ledger", "init", "--budget", "-1", "--ledger", "/nonexistent/l.db"),
    ("mechanisms", "--format", "nosuch"),
    ("wait-ready", "--timeout", "x"),
)


def _jsonable(value: object) -> object:
    if value is argparse.SUPPRESS:
        return "<SUPPRESS>"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


def _action(action: argparse.Action) -> dict[str, Any]:
    kind = getattr(action.type, "__name__", None) if action.type is not None else None
    return {
        "options": list(action.option_strings),
        "dest": action.dest,
        "action": type(action).__name__,
        "default": _jsonable(action.default),
        "type": kind if kind is not None else (None if action.type is None else repr(action.type)),
        "choices": None if action.choices is None else sorted(map(str, action.choices)),
        "nargs": _jsonable(action.nargs),
        "const": _jsonable(action.const),
        "required": action.required,
    }


def surface() -> dict[str, Any]:
    """Each command's options, then each bad command line's exit code and error line."""
    parsers = {
        p.prog: [
            _action(a) for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        for p, _ in commands(build_parser())
    }
    refusals = {}
    for argv in BAD:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        lines = [line for line in err.getvalue().splitlines() if "error" in line]
        refusals[" ".join(argv)] = {"exit": code, "error": lines[-1] if lines else ""}
    return {"commands": parsers, "refusals": refusals}


@pytest.fixture(scope="module")
def current() -> dict[str, Any]:
    return surface()


def test_the_recording_is_current(current: dict[str, Any]) -> None:
    if os.environ.get("RECSVC_RECORD_CLI"):
        REFERENCE.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    assert json.loads(REFERENCE.read_text())["commands"] == current["commands"]


def _flags(line: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]*", line))


@pytest.mark.parametrize("argv", [" ".join(a) for a in BAD])
def test_a_bad_command_line_is_refused_as_before(current: dict[str, Any], argv: str) -> None:
    """Refused as before: exit code 2 and an error line that names the same flags (a message may
    be reworded, never lose its culprit)."""
    got, before = current["refusals"][argv], json.loads(REFERENCE.read_text())["refusals"][argv]
    assert got["exit"] == before["exit"] == 2 and got["error"], got  # refused with an error line, not run
    assert _flags(before["error"]) <= _flags(got["error"]), (before["error"], got["error"])
