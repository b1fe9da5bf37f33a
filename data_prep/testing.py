"""Builders of small dataset files in the EXACT original on-disk formats, for testing the loaders and
the pipeline on every format they read.

Test helpers that are not fixtures live here, beside the code they exercise (as ``numpy.testing``
does); the test suite's fixtures live in its conftest.py files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from data_prep.config import PrepConfig
from data_prep.datasets.base import cast_checked, fail_at, integer_ids, read_lines, split_fields
from data_prep.split import TARGET_FRACTION, Split, canonical_order, to_csr, user_group


def tiny_prep(out: Path, **changes: Any) -> PrepConfig:
    """The quickest whole prep for a test: the synthetic ``tiny`` preset, one local worker, no
    progress bars, a small policy table; ``changes`` override any field."""
    base = PrepConfig(
        dataset="synthetic",
        preset="tiny",
        out=out,
        workers=1,
        chunk_users=16,
        progress=False,
        policy_users=20,
        policy_trials=5,
    )
    return replace(base, **changes)


def ml20m_prep(data: Path, out: Path, **changes: Any) -> PrepConfig:
    """A prep of ML-20M files written by :func:`write_ml20m` (a few dozen users): 10 test and 10
    validation users, one SANSA setting, one local worker; ``changes`` override any field."""
    base = PrepConfig(
        dataset="ml-20m",
        data_dir=data,
        out=out,
        test_users=10,
        val_users=10,
        l2=(10.0,),
        density=(0.2,),
        workers=1,
        progress=False,
    )
    return replace(base, **changes)


def ratings_table(users: int = 30, items: int = 25, per_user: tuple[int, int] = (3, 15), seed: int = 0) -> pl.DataFrame:
    """Random explicit ratings: columns user, item (ints as str), rating (1..5), ts (int)."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, str, float, int]] = []
    for u in range(1, users + 1):
        n = int(rng.integers(per_user[0], per_user[1] + 1))
        for i in rng.choice(np.arange(1, items + 1), size=n, replace=False):
            rows.append((str(u), str(int(i)), float(rng.integers(1, 6)), int(rng.integers(800_000_000, 900_000_000))))
    return pl.DataFrame(rows, schema=["user", "item", "rating", "ts"], orient="row")


def write_ml20m(directory: Path, table: pl.DataFrame, kaggle: bool = False) -> Path:
    """GroupLens ratings.csv (unix timestamps, ratings like 3.5) or Kaggle rating.csv (datetimes)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ("rating.csv" if kaggle else "ratings.csv")
    lines = ["userId,movieId,rating,timestamp"]
    for u, i, r, ts in table.iter_rows():
        stamp = str(np.datetime64(ts, "s")).replace("T", " ") if kaggle else str(ts)
        lines.append(f"{u},{i},{r:.1f},{stamp}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_udata(directory: Path, table: pl.DataFrame) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "u.data"
    path.write_text("".join(f"{u}\t{i}\t{int(r)}\t{ts}\n" for u, i, r, ts in table.iter_rows()))
    return path


def write_inter(directory: Path, table: pl.DataFrame) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ml-100k.inter"
    head = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    path.write_text(head + "".join(f"{u}\t{i}\t{int(r)}\t{ts}\n" for u, i, r, ts in table.iter_rows()))
    return path


def write_netflix(directory: Path, table: pl.DataFrame) -> list[Path]:
    """Movies spread over combined_data_1..4.txt, each 'MovieID:' then 'CustomerID,Rating,Date'."""
    directory.mkdir(parents=True, exist_ok=True)
    movies = sorted(table["item"].unique().to_list(), key=int)
    paths = []
    for part in range(4):
        lines = []
        for movie in movies[part::4]:
            lines.append(f"{movie}:")
            for u, _, r, ts in table.filter(pl.col("item") == movie).iter_rows():
                lines.append(f"{u},{int(r)},{np.datetime64(ts, 's').astype('datetime64[D]')}")
        path = directory / f"combined_data_{part + 1}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_amazon(directory: Path, train: dict[int, list[int]], test: dict[int, list[int]]) -> None:
    """LightGCN train.txt / test.txt: 'user item item …' per line."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in (("train.txt", train), ("test.txt", test)):
        (directory / name).write_text("".join(f"{u} {' '.join(map(str, items))}\n" for u, items in data.items()))


def triples(df: pl.DataFrame) -> set[tuple[str, str, float]]:
    return {(u, i, float(r)) for u, i, r in df.select("user", "item", "rating").iter_rows()}


def mark_targets_frame(df: pl.DataFrame, rng: np.random.Generator, fraction: float = TARGET_FRACTION) -> pl.DataFrame:
    """Marks floor(fraction·n_u) random interactions of each user as targets (table form)."""
    df = df.sort(["user", "item"])
    return (
        df.with_columns(pl.Series("_key", rng.random(df.height)))
        .with_columns(
            (pl.col("_key").rank("ordinal").over("user") <= (pl.len().over("user") * fraction).floor()).alias("target")
        )
        .drop("_key")
    )


def strong_split_frame(df: pl.DataFrame, test_users: int, val_users: int, seed: int) -> Split:
    """The strong split computed on a table of string ids, as the pipeline did before it split one
    int32 CSR matrix: the reference :func:`data_prep.split.strong_split` must equal exactly."""
    users = canonical_order(df["user"])
    item_ids = canonical_order(df["item"])
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(users))
    test_u, val_u, train_u = (
        users[perm[:test_users]],
        users[perm[test_users : test_users + val_users]],
        np.sort(users[perm[test_users + val_users :]]),
    )
    held = mark_targets_frame(df.filter(~pl.col("user").is_in(pl.Series(train_u).implode())), rng)
    train = to_csr(df.filter(pl.col("user").is_in(pl.Series(train_u).implode())), train_u, item_ids)
    validation = user_group(held, val_u, item_ids, True) if val_users else None
    return Split(item_ids, train, train_u, user_group(held, test_u, item_ids, True), validation)


def netflix_table(path: Path) -> pl.DataFrame:
    """A Netflix file parsed whole as a table of lines (how the loader read it before it streamed):
    the reference the streaming loader must equal."""
    from data_prep.datasets.netflix import EXPECTED, FORMAT

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
    cast_checked(movies, "movie_check", pl.Int64, path, "'MovieID:' with an integer MovieID")
    ratings = lines.filter(~pl.col("_movie"))
    fields = split_fields(ratings.select("line_no", "line"), ",", ["user", "rating", "date"], path, EXPECTED)
    fields = integer_ids(fields.with_columns(ratings["item"]), ["user", "item"], path, EXPECTED)
    return cast_checked(fields, "rating", pl.Float64, path, EXPECTED).select("user", "item", "rating")


def ml20m_table(path: Path) -> pl.DataFrame:
    """ratings.csv parsed whole as a table of lines: the streaming loader's reference."""
    from data_prep.datasets.movielens import ML20M_FORMAT

    lines = read_lines(path, ML20M_FORMAT)
    first = lines.drop_nulls("line").row(0, named=True)
    header = ["userId", "movieId", "rating", "timestamp"]
    if [h.strip() for h in first["line"].split("\t" if "\t" in first["line"] else ",")] != header:
        raise fail_at(path, first["line_no"], first["line"], f"the header {','.join(header)} ({ML20M_FORMAT})")
    body = lines.filter(pl.col("line_no") > first["line_no"])
    expected = "4 comma-separated fields userId,movieId,rating,timestamp"
    df = split_fields(body, ",", ["user", "item", "rating", "timestamp"], path, expected)
    df = integer_ids(df, ["user", "item"], path, expected)
    return cast_checked(df, "rating", pl.Float64, path, expected).select("user", "item", "rating")
