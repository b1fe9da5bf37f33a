"""Amazon-book loader in LightGCN's format: ``train.txt`` / ``test.txt``, lines ``user item item …``.

Weak generalisation (docs/reference/specification.md §4): train.txt is both the training data and the test users'
input; test.txt holds the targets, so rows carry ``target`` = True when they come from test.txt.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from data_prep.datasets.base import Interactions, fail_at, read_lines
from recsvc.checks import ParamError

FORMAT = "LightGCN {name}: whitespace-separated integer ids per line, 'user item item …'"


def parse_file(path: Path, target: bool) -> pl.DataFrame:
    fmt = FORMAT.format(name=path.name)
    lines = read_lines(path, fmt).drop_nulls("line")
    # Any run of whitespace separates ids; normalise tabs/multiple spaces first.
    tokens = lines.with_columns(
        pl.col("line").str.strip_chars().str.replace_all(r"\s+", " ").str.split(" ").alias("_tok")
    )
    numeric = pl.col("_tok").list.eval(pl.element().str.contains(r"^\d+$")).list.all()
    bad = tokens.filter(~numeric)
    if bad.height:
        row = bad.row(0, named=True)
        raise fail_at(
            path, row["line_no"], row["line"], "whitespace-separated non-negative integer ids 'user item item …'"
        )
    df = tokens.select(pl.col("_tok").list.first().alias("user"), pl.col("_tok").list.slice(1).alias("item")).explode(
        "item"
    )

    def canon(c: str) -> pl.Expr:
        """Strips leading zeros so ids are canonical decimal strings, like the other loaders."""
        return pl.col(c).cast(pl.Int64).cast(pl.String)

    return df.drop_nulls("item").select(
        canon("user").alias("user"),
        canon("item").alias("item"),
        pl.lit(None, pl.Float64).alias("rating"),
        pl.lit(target).alias("target"),
    )


def load(data_dir: Path | None) -> Interactions:
    if data_dir is None:
        raise ParamError("amazon-book needs {data_dir}: a directory containing LightGCN train.txt and test.txt")
    df = pl.concat([parse_file(data_dir / "train.txt", False), parse_file(data_dir / "test.txt", True)])
    return Interactions(df, source=str(data_dir / "{train,test}.txt"))
