"""The one ``recsvc`` command. Each part registers its own subcommands.

A part's ``cli`` module exposes ``register(subparsers) -> None`` and sets ``func`` on each of
its parsers via ``set_defaults(func=...)``; ``func(args) -> int`` is the exit code. Heavy
imports stay inside ``func`` so that ``recsvc --help`` is instant: importing a ``cli`` module
loads only argparse-level code.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from data_prep.cli import register as register_prep
from eval.cli import register as register_eval
from recsvc.app.demo import register as register_demo
from recsvc.checks import ParamError
from recsvc.mechanisms.cli import register as register_mechanisms
from recsvc.service.cli import register as register_service
from recsvc.service.device_cli import register as register_multiselect
from recsvc.settings import add_arguments, from_namespace, setting, typed
from recsvc.staging import Terminated, request_termination

# Order here is the order in `recsvc --help`.
REGISTRARS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    register_prep,  # prep, policy, serving-bundle
    register_eval,  # eval, eval-synthetic, eval-bandit, eval-two-candidates, eval-multiselect, eval-feature-selection
    register_service,  # serve, wait-ready, select, budget
    register_multiselect,  # multiselect
    register_mechanisms,  # mechanisms
    register_demo,  # demo
)
# The install extra each command needs beyond the base install (pyproject.toml; docs/getting-started.md).
EXTRA = {
    "prep": "prep",
    "serving-bundle": "serve",
    "eval": "eval",
    "eval-synthetic": "eval",
    "eval-bandit": "eval",
    "eval-two-candidates": "eval",
    "eval-multiselect": "eval",
    "eval-feature-selection": "eval",
    "serve": "serve",
    "wait-ready": "serve",
    "select": "serve",
    "budget": "serve",
    "multiselect": "serve",
    "ledger": "serve",
    "demo": "all",
}
PROJECT_PACKAGES = ("recsvc", "data_prep", "eval")


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` states this option's default: every option that takes a value and has
    one. A flag that takes no value (``--force``) is off unless given, and an empty string or list
    is no value (its help says what leaving it out means), so these state none."""
    empty = action.default is None or (isinstance(action.default, (str, list, tuple)) and not action.default)
    return bool(action.option_strings) and action.nargs != 0 and not empty and action.default is not argparse.SUPPRESS


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already states it (through
    ``%(default)s`` or by naming the value after the word "default"). Options without help get
    a line of their own, so no default is hidden."""

    def _format_action(self, action: argparse.Action) -> str:
        return super()._format_action(self._with_help(action))

    def help_text(self, action: argparse.Action) -> str:
        """The help ``--help`` shows for ``action``, its default included ('' for none)."""
        action = self._with_help(action)
        return self._expand_help(action) if action.help else ""

    @staticmethod
    def _with_help(action: argparse.Action) -> argparse.Action:
        if action.help is None and shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return action

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not shows_default(action) or "%(default)" in text:
            return text
        shown = typed(action.default)
        if "default" in text and shown in re.sub(r"(?<=\d),(?=\d{3})", "", text):  # 50,000 states 50000
            return text
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()

    def _expand_help(self, action: argparse.Action) -> str:
        if shows_default(action):  # %(default)s renders like the appended note
            action = copy.copy(action)
            action.default = typed(action.default)
        return super()._expand_help(action)


class Parser(argparse.ArgumentParser):
    """``recsvc`` and every subcommand's parser (``add_subparsers`` passes its class on): they all
    show defaults the same way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


@dataclass(frozen=True)
class Options:
    """The switches of ``recsvc`` itself, given before the command."""

    verbose: bool = setting(False, aliases=("-v",), help="debug logging")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="recsvc",
        description="Differentially private item selection for recommenders.",
    )
    add_arguments(parser, Options)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def flag_names(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Parameter name → the subcommand's flag for it (``out`` → ``--out``): its first long
    option, so an alias (``--users``/``--repeats``) is shown by the name the help lists first."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = list(sub.choices[command]._actions)
    for nested in [a for a in actions if isinstance(a, argparse._SubParsersAction)]:  # `ledger init`, ...
        actions += [a for p in nested.choices.values() for a in p._actions]
    return {
        a.dest: next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
        for a in actions
        if a.option_strings
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = from_namespace(Options, args).verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        # Dask's cluster start/stop chatter drowns the results; distributed reads this when
        # it is first imported (by an engine), and then configures its own loggers from it.
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    # SIGTERM unwinds like Ctrl-C, so every `finally` (temporary and scratch directories) runs.
    # `serve` installs its own handler (drain, then exit 0) when it starts.
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    if args.command not in _NO_PIPELINE:
        _bridge_numpy_to_polars()
    sys.unraisablehook = _quiet_terminated
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args) or 0)
    except ParamError as exc:  # the library names its parameters; show this command's flags
        print(f"recsvc {args.command}: error: {exc.render(flag_names(parser, args.command))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a light install without this command's extra
        if args.command not in EXTRA or (exc.name or "").split(".")[0] in PROJECT_PACKAGES:
            raise
        print(
            f"recsvc {args.command}: error: {exc.name} is not installed; this command needs "
            f"pip install 'recsvc[{EXTRA[args.command]}]'",
            file=sys.stderr,
        )
        return 2
    except (ValueError, OSError) as exc:
        # Bad input or an unusable path/address: one clear line, no traceback. ArtifactError,
        # mechanism errors and FileNotFoundError are among these.
        print(f"recsvc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Terminated:
        print(f"recsvc {args.command}: terminated", file=sys.stderr)
        return 143


_MAIN_PID: int | None = None
# Commands that run no data pipeline (client calls, the ledger's tools, the mechanism list, and
# `serve`, which installs its own handler): they skip :func:`_bridge_numpy_to_polars`.
_NO_PIPELINE = {"select", "multiselect", "budget", "ledger", "mechanisms", "serve", "wait-ready"}


def _bridge_numpy_to_polars() -> None:
    """polars (Rust, through pyo3) loads numpy's C API the first time it is handed an array, by
    running numpy's Python code from Rust. A SIGTERM that :func:`_terminate` raised in there became
    a Rust panic (exit 1, a Rust backtrace, no "terminated"), so it is loaded here, before that
    handler is installed."""
    import numpy as np
    import polars as pl

    pl.Series(np.zeros(1, dtype=np.int64))


def _quiet_terminated(unraisable: Any) -> None:
    """A :class:`Terminated` that Python could not raise (the signal landed in a C callback or a
    ``__del__``, e.g. llvmlite's while numba compiles on a cold cache) needs no traceback:
    :func:`request_termination` recorded it, and the run stops as "terminated" at its next check.
    Anything else goes to Python's own hook."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, Terminated):
        return
    sys.__unraisablehook__(unraisable)


def _terminate(signum: int, frame: object) -> None:
    if os.getpid() != _MAIN_PID:  # a forked worker inherited this handler: die as SIGTERM would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    request_termination()
    raise Terminated()


if __name__ == "__main__":
    sys.exit(main())
