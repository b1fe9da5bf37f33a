"""Netflix Prize loader: ``combined_data_1..4.txt`` (a ``MovieID:`` line, then ``CustomerID,Rating,Date``),
or the Prize's original ``training_set/mv_*.txt`` (one movie per file, same format).

Files are streamed block by block (:mod:`data_prep.datasets.fastparse`): the 100 M ratings of the
full Prize data become integer arrays without a per-line string."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from data_prep.datasets import fastparse
from data_prep.datasets.base import (
    DataError,
    Ratings,
    cast_checked,
    fail_at,
    integer_ids,
    require_file,
    split_fields,
)
from recsvc.checks import ParamError

FILES = tuple(f"combined_data_{i}.txt" for i in range(1, 5))
FORMAT = "Netflix combined_data_N.txt: a 'MovieID:' line, then 'CustomerID,Rating,Date' lines"
EXPECTED = "'CustomerID,Rating,Date' (3 comma-separated fields)"


def _line_parser(path: Path) -> fastparse.SlowLine:
    """The full rules for one line the scanner does not take (blanks around fields, signs, …)."""

    def parse_line(text: str, line_no: int, movie: int) -> tuple[int, int, int, float]:
        line = text.strip()
        if not line:
            return 0, 0, 0, 0.0
        row = pl.DataFrame({"line_no": [line_no], "line": [line]})
        if line.endswith(":"):
            movie_df = row.with_columns(pl.lit(line[:-1]).alias("movie_check"))
            movie_df = cast_checked(movie_df, "movie_check", pl.Int64, path, "'MovieID:' with an integer MovieID")
            return 1, int(movie_df["movie_check"][0]), 0, 0.0
        if movie < 0:
            raise fail_at(path, line_no, line, "a 'MovieID:' line before the first rating")
        fields = split_fields(row, ",", ["user", "rating", "date"], path, EXPECTED)
        fields = cast_checked(integer_ids(fields, ["user"], path, EXPECTED), "rating", pl.Float64, path, EXPECTED)
        return 2, int(fields["user"][0]), movie, float(fields["rating"][0])

    return parse_line


def parse_file(path: Path) -> Ratings:
    require_file(path, FORMAT)
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; expected {FORMAT}")
    got = fastparse.parse(path, fastparse.NETFLIX, _line_parser(path))
    if got.movie < 0:
        raise DataError(f"{path} is empty; expected {FORMAT}")
    return Ratings(got.users, got.items, got.ratings, str(path))


def _concat(parts: list[Ratings], source: str) -> Ratings:
    return Ratings(
        np.concatenate([p.users for p in parts]),
        np.concatenate([p.items for p in parts]),
        np.concatenate([p.ratings for p in parts]),
        source,
    )


def load(data_dir: Path | None) -> Ratings:
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
        return _concat([parse_file(f) for f in files], str(per_movie[0].parent / "mv_*.txt"))
    files = tqdm([data_dir / f for f in FILES], desc="netflix combined_data", unit="file", disable=None)
    return _concat([parse_file(f) for f in files], str(data_dir / "combined_data_[1-4].txt"))


def _per_movie_files(data_dir: Path) -> list[Path]:
    for d in (data_dir / "training_set", data_dir):
        files = sorted(d.glob("mv_*.txt"))
        if files:
            return files
    return []
