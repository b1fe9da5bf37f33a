"""What every study does the same way around its own computation: publish its results directory
atomically (:class:`recsvc.staging.StagedDir`: a temp sibling renamed into place, nothing left on
a failure; no directory without ``--out``), echo the paper's statements it checked, and show a
grid of numbers as a user types it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from recsvc.staging import StagedDir


class _Config(Protocol):
    @property
    def out(self) -> Path | None: ...
    @property
    def force(self) -> bool: ...


class _Result(Protocol):
    out: Path | None  # where the results were published

    @property
    def config(self) -> _Config: ...


class _Statement(Protocol):
    @property
    def statement(self) -> str: ...
    @property
    def holds(self) -> bool: ...
    @property
    def detail(self) -> str: ...


R = TypeVar("R", bound=_Result)


def publish(result: R, write: Callable[[R, Path], None], protect: Mapping[str, Path] | None = None) -> R:
    """``write(result, tmp)`` fills the staged directory of ``result.config.out`` (and notes the
    figures it saved in ``result``); the directory is then published. Nothing is written without
    an ``out``."""
    cfg = result.config
    if cfg.out is None:
        return result
    with StagedDir(cfg.out, cfg.force, protect=protect) as stage:
        write(result, stage.tmp)
        result.out = stage.publish()
    return result


def findings_text(head: str, findings: Sequence[_Statement], out: Path | None, tail: str = "") -> str:
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
