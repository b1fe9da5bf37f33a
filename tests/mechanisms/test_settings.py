"""recsvc.settings: a setting declared once gives its flag, its default in --help, its check and its config."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recsvc.app.cli import Parser
from recsvc.checks import ParamError
from recsvc.settings import (
    Each,
    OneOf,
    Range,
    Setting,
    add_arguments,
    add_setting,
    check,
    from_namespace,
    setting,
    settings_of,
)


@dataclass(frozen=True)
class Inner:
    port: int = setting(50051, help="port to listen on", check=Range(0, 65535, integer=True))
    pool: int = setting(8, name="ledger_pool", help="connections per process", check=Range(1, integer=True))


@dataclass(frozen=True)
class Config:
    out: Path = setting(help="output directory")
    timeout: float = setting(10.0, unit="seconds", help="how long to wait", check=Range(0, 86_400, low_open=True))
    share: float = setting(0.25, help="a fraction", check=Range(0, 1, low_open=True))
    mode: str = setting("fast", help="how to run", check=OneOf(("fast", "slow")))
    epsilons: tuple[float, ...] = setting(
        (0.1, 1.0), nargs="+", type=float, help="budgets", check=Each(Range(0, low_open=True))
    )
    force: bool = setting(False, help="replace an existing output")
    inner: Inner = field(default_factory=Inner)
    note: str = ""  # not a setting: set by the code


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="t")
    add_arguments(p, Config)
    return p


def test_every_setting_becomes_its_flag_with_its_default_and_help() -> None:
    p = _parser()
    actions = {a.dest: a for a in p._actions if a.option_strings and a.dest != "help"}
    assert list(actions) == ["out", "timeout", "share", "mode", "epsilons", "force", "port", "ledger_pool"]
    assert actions["out"].required and actions["out"].type is Path
    assert (actions["timeout"].default, actions["timeout"].type, actions["timeout"].metavar) == (10.0, float, "SECONDS")
    assert actions["mode"].choices == ("fast", "slow")
    assert actions["epsilons"].nargs == "+" and actions["epsilons"].default == (0.1, 1.0)
    assert isinstance(actions["force"], argparse._StoreTrueAction)
    assert actions["ledger_pool"].option_strings == ["--ledger-pool"]  # a group's setting under its flat name
    text = p.format_help()
    assert "how long to wait (default: 10)" in " ".join(text.split())
    assert "budgets (default: 0.1 1)" in " ".join(text.split())


def test_the_parsed_flags_build_the_checked_config_and_its_groups() -> None:
    args = _parser().parse_args(["--out", "o", "--share", "0.5", "--epsilons", "1", "2", "--ledger-pool", "3"])
    c = from_namespace(Config, args, note="n")
    assert c == Config(Path("o"), 10.0, 0.5, "fast", (1.0, 2.0), False, Inner(50051, 3), "n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--share", "0"], "share must be a finite number in (0, 1], got 0"),
        (["--share", "nan"], "share must be a finite number in (0, 1], got nan"),
        (["--timeout", "inf"], "timeout must be a finite number in (0, 86400], got inf"),
        (["--epsilons", "1", "-2"], "epsilons must be one or more values, each a finite number > 0, got 1 -2"),
        (["--port", "70000"], "port must be an integer in [0, 65535], got 70000"),
        (["--ledger-pool", "0"], "ledger_pool must be an integer ≥ 1, got 0"),
    ],
)
def test_a_value_outside_its_constraint_is_refused_naming_it(argv: list[str], message: str) -> None:
    args = _parser().parse_args(["--out", "o", *argv])
    with pytest.raises(ParamError) as info:
        from_namespace(Config, args)
    assert str(info.value) == message
    flag = "--" + info.value.params[0].replace("_", "-")
    assert info.value.render({info.value.params[0]: flag}).startswith(flag + " must be")


def test_check_reads_a_config_built_in_code() -> None:
    check(Config(Path("o")))
    with pytest.raises(ParamError, match="mode must be one of fast, slow, got 'medium'"):
        check(Config(Path("o"), mode="medium"))
    with pytest.raises(ParamError, match="port must be an integer"):
        check(Config(Path("o"), inner=Inner(port=1.5)))  # type: ignore[arg-type]  # a float where an int is declared: the check must catch it


def test_range_describes_what_it_holds() -> None:
    r = Range(1e-6, 1, high_open=True)
    assert r.describe() == "a finite number in [1e-06, 1)"
    assert [r.holds(v) for v in (1e-6, 0.5, 1.0, math.nan, True, "0.5")] == [True, True, False, False, False, False]
    assert Range(0, integer=True, none=True).describe() == "an integer ≥ 0"  # a flag left out is the none
    assert Range(0, integer=True, none=True).holds(None) and not Range(0).holds(None)
    assert Range(low=10_000, integer=True).describe() == "an integer ≥ 10000"
    assert [d.name for d in settings_of(Config)][-2:] == ["port", "ledger_pool"]
    assert [Range(0, 1, low_open=True).interval, Range(1).interval, Range(high=0, high_open=True).interval] == [
        "(0, 1]",
        "[1, ∞)",
        "(-∞, 0)",
    ]


def test_a_setting_declared_outside_a_config_class_gets_its_flag_too() -> None:
    p = Parser(prog="t")
    spec = Setting("share of the budget", unit="share", check=Range(0, 1, none=True), type=float)
    action = add_setting(p, "budget_share", spec)
    assert (action.option_strings, action.dest, action.default, action.type, action.metavar) == (
        ["--budget-share"],
        "budget_share",
        None,
        float,
        "SHARE",
    )
    switch = add_setting(p, "quiet", Setting("say less", aliases=("-q",)), False)
    assert switch.option_strings == ["-q", "--quiet"]  # a short alias first, as --help lists it
    assert p.parse_args(["-q", "--budget-share", "0.5"]) == argparse.Namespace(budget_share=0.5, quiet=True)


def test_a_setting_without_help_is_refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="one non-empty line"):
        setting(1, help="")


def test_optional_choices_and_lists_accept_none_and_say_what_a_value_must_be() -> None:
    """OneOf and Each with none=True (a flag whose default None means "the data's own")."""
    engines, l2 = OneOf(("local", "dask"), none=True), Each(Range(0, low_open=True), none=True)
    assert engines.holds(None) and engines.holds("dask") and not engines.holds("spark")
    assert not OneOf(("local",)).holds(None)
    assert l2.holds(None) and l2.holds((1.0, 2.0)) and not l2.holds((1.0, -2.0)) and not l2.holds(())
    assert not l2.holds("1.0")  # a string is not a list of numbers
    assert l2.describe() == "one or more values, each a finite number > 0"
    assert Each(OneOf(("a", "b")), least=2).describe() == "2 or more values, each one of a, b"


def test_a_repeated_setting_collects_each_value_given() -> None:
    @dataclass(frozen=True)
    class Many:
        candidate: tuple[str, ...] | None = setting(None, unit="id:score", repeat=True, help="one candidate; repeat")

    p = Parser(prog="t")
    add_arguments(p, Many)
    action = next(a for a in p._actions if a.dest == "candidate")
    assert isinstance(action, argparse._AppendAction) and action.metavar == "ID:SCORE"
    assert from_namespace(Many, p.parse_args(["--candidate", "a:1", "--candidate", "b:2"])).candidate == ("a:1", "b:2")
    assert from_namespace(Many, p.parse_args([])).candidate is None


def test_a_flag_left_out_keeps_a_default_the_flag_does_not_show() -> None:
    """flag_default=None: the flag's default is None (its help states the real one), and leaving
    it out keeps the field's own default in the config, while giving it sets the value."""

    @dataclass(frozen=True)
    class Grid:
        epsilons: tuple[float, ...] = setting(
            (0.1, 1.0, 10.0), nargs="+", type=float, flag_default=None, help="ε grid (default: the paper's)"
        )

    p = Parser(prog="t")
    add_arguments(p, Grid)
    assert next(a for a in p._actions if a.dest == "epsilons").default is None
    assert from_namespace(Grid, p.parse_args([])).epsilons == (0.1, 1.0, 10.0)
    assert from_namespace(Grid, p.parse_args(["--epsilons", "2"])).epsilons == (2.0,)
