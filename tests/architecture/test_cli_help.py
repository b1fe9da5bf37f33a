"""Every option of every ``recsvc`` subcommand shows its default in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from recsvc.app.cli import build_parser, shows_default
from recsvc.settings import typed


def _commands(parser: argparse.ArgumentParser, name: str = "recsvc") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``recsvc`` and each (sub)subcommand's parser, by its command line (``recsvc ledger init``)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}")


def _help_of(text: str, action: argparse.Action) -> str:
    """The lines ``--help`` shows for ``action``: its invocation line and the indented lines below it."""
    lines = text.splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if line.strip().split("  ")[0].split(", ")[-1].split(" ")[0] in action.option_strings
    )
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("   "):  # the next option (two spaces, then '-') or section
            break
        block.append(line)
    return " ".join(block)


COMMANDS = dict(_commands(build_parser()))


def test_every_subcommand_is_walked() -> None:
    assert {
        "recsvc serve",
        "recsvc select",
        "recsvc ledger init",
        "recsvc ledger export",
        "recsvc prep",
        "recsvc eval-two-candidates",
    } <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_with_a_default_shows_it(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")  # one line per option: no wrapped value to reassemble
    parser = COMMANDS[command]
    text = parser.format_help()
    missing = []
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or not shows_default(action):
            continue
        shown = _help_of(text, action)
        if "default" not in shown or typed(action.default) not in shown.replace(",", ""):
            missing.append(f"{action.option_strings[-1]} (default {typed(action.default)}): {shown.strip()}")
    assert not missing, f"`{command} --help` hides these defaults:\n" + "\n".join(missing)


def _option(command: str, flag: str) -> str:
    parser = COMMANDS[command]
    return _help_of(parser.format_help(), next(a for a in parser._actions if flag in a.option_strings))


def test_help_shows_the_defaults_of_options_without_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recsvc option has help (a setting must), but the formatter does not rely on it."""
    from recsvc.app.cli import Parser

    monkeypatch.setenv("COLUMNS", "10000")
    parser = Parser(prog="t")
    parser.add_argument("--host", default="127.0.0.1")
    host = next(a for a in parser._actions if "--host" in a.option_strings)
    assert _help_of(parser.format_help(), host).split() == ["--host", "HOST", "(default:", "127.0.0.1)"]
    assert _option("recsvc serve", "--host").split()[-2:] == ["(default:", "127.0.0.1)"]
    assert _option("recsvc serve", "--metrics-host").split()[-2:] == ["(default:", "127.0.0.1)"]
    assert _option("recsvc serve", "--budget").endswith("per-user ε budget (basic composition) (default: 10)")


def test_a_stated_default_is_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")
    horizon = _option("recsvc eval-bandit", "--horizon")
    assert horizon.count("default") == 1 and "50,000" in horizon


def test_flags_without_a_value_show_no_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")
    assert "default" not in _option("recsvc ledger export", "--force")
