"""Netflix Prize loader: ``combined_data_1..4.txt`` (a ``MovieID:`` line, then ``CustomerID,Rating,Date``),
or the Prize's original ``training_set/mv_*.txt`` (one movie per file, same format)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from tqdm.auto import tqdm

from data_prep.datasets.base import (
    DataError,
    Interactions,
    cast_checked,
    fail_at,
    integer_ids,
    read_lines,
    split_fields,
)
from recsvc.checks import ParamError

FILES = tuple(f"combined_data_{i}.txt" for i in range(1, 5))
FORMAT = "Netflix combined_data_N.txt: a 'MovieID:' line, then 'CustomerID,Rating,Date' lines"


def parse_file(path: Path) -> pl.DataFrame:
    lines = read_lines(path, FORMAT).drop_nulls("line")
    is_movie = pl.col("line").str.ends_with(":")
    first = lines.row(0, named=True)
    if not first["line"].endswith(":"):
        raise fail_at(path, first["line_no"], first["line"], "a 'MovieID:' line before the first rating")
    lines = lines.with_columns(
        pl.when(is_movie).then(pl.col("line").str.strip_suffix(":")).forward_fill().alias("item"),
        is_movie.alias("_movie"),
    )
    movies = lines.filter(pl.col("_movie")).with_columns(pl.col("item").alias("movie_check"))
    movies = cast_checked(movies, "movie_check", pl.Int64, path, "'MovieID:' with an integer MovieID")
    ratings = lines.filter(~pl.col("_movie"))
    expected = "'CustomerID,Rating,Date' (3 comma-separated fields)"
    fields = split_fields(ratings.select("line_no", "line"), ",", ["user", "rating", "date"], path, expected)
    fields = fields.with_columns(ratings["item"])
    fields = integer_ids(fields, ["user", "item"], path, expected)
    fields = cast_checked(fields, "rating", pl.Float64, path, expected)
    return fields.select("user", "item", "rating")


def load(data_dir: Path | None) -> Interactions:
    if data_dir is None:
        raise ParamError(
            "netflix needs {data_dir}: a directory containing {files} (or the Prize's training_set/mv_*.txt)",
            files=", ".join(FILES),
        )
    missing = [f for f in FILES if not (data_dir / f).is_file()]
    if missing:
        per_movie = _per_movie_files(data_dir)
        if not per_movie:
            raise DataError(
                f"data file {data_dir / missing[0]} not found; expected {FORMAT} (all of "
                f"{', '.join(FILES)}), or the Prize's training_set/mv_*.txt"
            )
        files = tqdm(per_movie, desc="netflix mv_*.txt", unit="file", disable=None)
        return Interactions(pl.concat([parse_file(f) for f in files]), source=str(per_movie[0].parent / "mv_*.txt"))
    df = pl.concat([parse_file(data_dir / f) for f in FILES])
    return Interactions(df, source=str(data_dir / "combined_data_[1-4].txt"))


def _per_movie_files(data_dir: Path) -> list[Path]:
    for d in (data_dir / "training_set", data_dir):
        files = sorted(d.glob("mv_*.txt"))
        if files:
            return files
    return []
