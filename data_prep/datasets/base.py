"""Shared parsing helpers: read a text file as numbered lines, split and type-check fields.

Parsing is vectorised with polars so that 20M-line files load in seconds, yet every error
still names the file, the 1-based line number and the expected format.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl


class DataError(ValueError):
    """Input data is missing, malformed or unusable; the message says what was expected."""


@dataclass(frozen=True)
class Interactions:
    """Raw interactions in the dataset's own ids.

    ``df`` columns: ``user`` (str), ``item`` (str), ``rating`` (f64, null for implicit data) and,
    for weak-generalisation datasets only, ``target`` (bool: True = held-out target).
    """

    df: pl.DataFrame
    source: str  # human-readable origin, recorded in the manifest


@dataclass(frozen=True)
class Ratings:
    """Explicit ratings with integer ids as arrays: what the large loaders (Netflix, ML-20M) return,
    at 12 bytes a rating. ``df`` is the same data as an :class:`Interactions` table (small data)."""

    users: np.ndarray  # int32 (int64 if an id needs it)
    items: np.ndarray
    ratings: np.ndarray  # float32
    source: str

    @property
    def df(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"user": self.users, "item": self.items, "rating": self.ratings.astype(np.float64)}
        ).with_columns(pl.col("user").cast(pl.String), pl.col("item").cast(pl.String))


def require_file(path: Path, fmt: str) -> Path:
    if not path.is_file():
        raise DataError(f"data file {path} not found; expected {fmt}")
    return path


def read_lines(path: Path, fmt: str) -> pl.DataFrame:
    """All lines of ``path`` as columns ``line_no`` (1-based) and ``line`` (blank → null)."""
    require_file(path, fmt)
    return lines_from_source(path, path, fmt)


def lines_from_source(source: Path | bytes, path: Path | str, fmt: str) -> pl.DataFrame:
    """``source`` is a file path (streamed by polars) or the file's bytes (e.g. from a zip)."""
    if (source.stat().st_size if isinstance(source, Path) else len(source)) == 0:
        raise DataError(f"{path} is empty; expected {fmt}")
    try:
        df = pl.read_csv(
            source,
            has_header=False,
            separator="\x1f",  # a byte that never occurs in these formats: one column per line
            quote_char=None,
            new_columns=["line"],
            schema={"line": pl.String},
        )
    except Exception as exc:  # polars raises ComputeError for non-UTF-8 input
        raise DataError(f"{path} could not be read as text ({exc}); expected {fmt}") from exc
    df = df.with_row_index("line_no", offset=1).with_columns(
        pl.col("line").str.strip_chars().replace("", None)  # CRLF, stray blanks, whitespace-only lines
    )
    if df["line"].null_count() == df.height:
        raise DataError(f"{path} is empty; expected {fmt}")
    return df


def fail_at(path: Path | str, line_no: int, line: str | None, expected: str) -> DataError:
    shown = "" if line is None else repr(line[:80])
    return DataError(f"{path}, line {line_no}: malformed line {shown}; expected {expected}")


def split_fields(lines: pl.DataFrame, sep: str, names: list[str], path: Path | str, expected: str) -> pl.DataFrame:
    """Splits each non-blank line on ``sep`` into exactly ``len(names)`` string columns."""
    lines = lines.drop_nulls("line")
    parts = lines.with_columns(pl.col("line").str.split(sep).alias("_parts"))
    bad = parts.filter(pl.col("_parts").list.len() != len(names))
    if bad.height:
        row = bad.row(0, named=True)
        raise fail_at(path, row["line_no"], row["line"], expected)
    return parts.select(
        "line_no",
        "line",
        *[pl.col("_parts").list.get(i).str.strip_chars().alias(n) for i, n in enumerate(names)],
    )


def cast_checked(
    df: pl.DataFrame, column: str, dtype: pl.DataType | type[pl.DataType], path: Path | str, expected: str
) -> pl.DataFrame:
    """Casts ``column``; the first value that does not parse is reported with its line."""
    cast = pl.col(column).cast(dtype, strict=False)
    bad = df.filter(cast.is_null() | (cast.is_nan() if dtype == pl.Float64 else pl.lit(False)))
    if bad.height:
        row = bad.row(0, named=True)
        raise fail_at(path, row["line_no"], row["line"], f"{expected} ({column} {row[column]!r} is not valid)")
    return df.with_columns(cast)


def integer_ids(df: pl.DataFrame, columns: list[str], path: Path | str, expected: str) -> pl.DataFrame:
    """Checks that id columns are integers and normalises them to canonical decimal strings."""
    for c in columns:
        df = cast_checked(df, c, pl.Int64, path, expected).with_columns(pl.col(c).cast(pl.String))
    return df
