"""One framework for every paper study. A study declares a :class:`Study` once: its config class,
computation, outputs with their schemas, report body and figures. :func:`execute` does the rest:
the settings' and the study's checks before any work, the output directory (refused when it
exists unless ``force``; staged by :class:`recsvc.staging.StagedDir`, so nothing is left on a
failure; none without ``out``), each output's schema, the report skeleton and the figures."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import polars as pl

from recsvc.checks import ParamError
from recsvc.settings import check, settings_of, typed
from recsvc.staging import StagedDir, check_out

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class _Config(Protocol):
    @property
    def out(self) -> Path | None: ...
    @property
    def force(self) -> bool: ...


class _Result(Protocol):
    out: Path | None  # where the results were published

    @property
    def config(self) -> Any: ...  # the config the run used (each study's own class)


C = TypeVar("C", bound=_Config)
R = TypeVar("R", bound=_Result)
Schema = Mapping[str, Any] | tuple[str, ...]  # a table's columns → polars dtypes, or a JSON object's keys
Data = pl.DataFrame | Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    """One of the paper's statements checked on a study's results (:func:`findings_text`)."""

    statement: str  # the paper's claim, as we test it
    holds: bool
    detail: str  # what we measured


class SchemaError(ValueError):
    """An output does not have the schema its study declares (a bug in the study, not bad input)."""


@dataclass(frozen=True)
class Output(Generic[R]):
    """One file: ``name``'s suffix picks the format (.parquet, .csv, .json); ``data(result)`` is
    its table or JSON object, or None when this run has none (e.g. a part the config skipped)."""

    name: str
    data: Callable[[R], Data | None]
    schema: Schema


@dataclass(frozen=True)
class Study(Generic[C, R]):
    """What a study declares; :func:`execute` runs it. ``validate`` is the study's cross-field
    checks (after :func:`recsvc.settings.check`), returning the config the run uses; ``plots``
    returns file name → figure (saved in that order, with the figure's own dpi). With ``streams``,
    ``run(config, tmp)`` fills the staged directory while it runs (``tmp`` None without ``out``);
    without ``skeleton``, report.md is ``report(result)`` verbatim; ``protect`` names the run's
    inputs that ``out`` must never be, contain or overlap (:func:`recsvc.staging.check_out`)."""

    title: str
    config: type[C]
    run: Callable[..., R]  # (config) → result, or (config, tmp) → result with ``streams``
    outputs: tuple[Output[R], ...]
    report: Callable[[R], str]
    plots: Callable[[R], Mapping[str, Figure]] = lambda result: {}
    validate: Callable[[C], C] = lambda cfg: cfg
    streams: bool = False
    skeleton: bool = True
    protect: Callable[[C], Mapping[str, Path]] = lambda cfg: {}


def execute(study: Study[C, R], config: C, into: Path | None = None) -> R:
    """Checks every setting and the output directory before any work, runs the study, and (with
    ``config.out``) publishes its outputs, figures and ``report.md`` atomically. ``into`` is a new
    directory inside another study's staged one (a sweep's level): the files go there, and
    ``config.out`` is where that study will publish them."""
    check(config)
    config = study.validate(config)
    protect = study.protect(config)
    if config.out is None:
        return study.run(config, None) if study.streams else study.run(config)
    if into is not None:
        into.mkdir()
        written = study.run(config, into) if study.streams else study.run(config)
        _write(study, written, into)
        written.out = config.out
        return written
    check_out(config.out, config.force, protect=protect)  # before the work; StagedDir checks again at publish
    result = None if study.streams else study.run(config)  # a run that streams fills the staged dir
    with StagedDir(config.out, config.force, protect=protect) as stage:
        if result is None:
            result = study.run(config, stage.tmp)
        _write(study, result, stage.tmp)
        result.out = stage.publish()
    return result


def _write(study: Study[Any, R], result: R, tmp: Path) -> None:
    from eval.figures import save_figure  # matplotlib only for a run that writes

    for output in study.outputs:
        data = output.data(result)
        if data is not None:
            write_output(tmp / output.name, data, output.schema)
    figures = study.plots(result)
    for name, fig in figures.items():
        save_figure(fig, tmp / name)
    text = study.report(result)
    text = report_text(study.title, result.config, text, list(figures)) if study.skeleton else text
    (tmp / "report.md").write_text(text)


def write_output(path: Path, data: Data, schema: Schema) -> None:
    """Writes ``data`` in ``path``'s format (.parquet, .csv, .json) after checking that it has
    ``schema``; a column of nulls only (an empty part) passes as any dtype."""
    if isinstance(data, pl.DataFrame):
        got, want = dict(data.schema), dict(schema) if isinstance(schema, Mapping) else {}
        if list(got) != list(want) or any(got[k] not in (want[k], pl.Null) for k in want):
            raise SchemaError(f"{path.name} has columns {got}; its study declares {want}")
        return data.write_parquet(path) if path.suffix == ".parquet" else data.write_csv(path)
    if isinstance(schema, Mapping) or list(data) != list(schema):
        raise SchemaError(f"{path.name} has keys {list(data)}; its study declares {list(schema)}")
    path.write_text(json.dumps(data, indent=2) + "\n")


def report_text(title: str, config: object, body: str, figures: Sequence[str]) -> str:
    """report.md: the title, the study's body, the figures the body does not show itself, then the
    config's settings (but where the results go: ``out`` and ``force`` change no number)."""
    parts = [f"# {title}", "", body.strip("\n"), ""]
    unshown = [f for f in figures if f"]({f})" not in body]
    if unshown:
        parts += ["## Figures", "", *(line for f in unshown for line in (f"![{f}]({f})", ""))]
    parts += ["## Settings", "", "| setting | value |", "|---|---|"]
    parts += [
        f"| {d.name} | {typed(attrgetter('.'.join(d.path))(config))} |"
        for d in settings_of(type(config))
        if d.name not in ("out", "force")
    ]
    return "\n".join(parts) + "\n"


def findings_text(head: str, findings: Sequence[Finding], out: Path | None, tail: str = "") -> str:
    """The summary a study prints: ``head``, how many of the paper's statements hold, ``tail``,
    then each statement marked and the report's path."""
    held = sum(f.holds for f in findings)
    lines = [f"{head}{held} of {len(findings)} of the paper's statements hold{tail}"]
    lines += [f"  [{'yes' if f.holds else 'NO '}] {f.statement}: {f.detail}" for f in findings]
    if out is not None:
        lines.append(f"report: {out / 'report.md'}")
    return "\n".join(lines)


def grid_text(values: Iterable[float]) -> str:
    """A grid as a user types it: ``0.1 1 3``."""
    return " ".join(f"{v:g}" for v in values)


def distinct(param: str, values: Sequence[object], known: Sequence[str] | None = None, empty: bool = True) -> tuple:
    """A grid's values, refused naming its flag when two are equal, one is not ``known``, or there
    are none and ``empty`` is false (every study's grids)."""
    if isinstance(values, str):
        values = (values,)
    if not values and not empty:
        raise ParamError(f"{{{param}}} is empty; give at least one value")
    if len(set(values)) != len(values):
        raise ParamError(f"{{{param}}} must be distinct, got {{values}}", values=" ".join(map(str, values)))
    if known is not None:
        for v in values:
            if v not in known:
                raise ParamError(
                    f"unknown {{{param}}} value {{value}}; expected some of {{known}}",
                    value=repr(v),
                    known=", ".join(known),
                )
    return tuple(values)
