"""MovieLens loaders: ML-20M (GroupLens ``ratings.csv`` / Kaggle ``rating.csv``) and ML-100K
(GroupLens ``u.data`` / RecBole ``ml-100k.inter``, by default straight out of the recbole wheel)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl

from data_prep.datasets import fastparse
from data_prep.datasets.base import (
    DataError,
    Interactions,
    Ratings,
    cast_checked,
    fail_at,
    integer_ids,
    lines_from_source,
    read_lines,
    require_file,
    split_fields,
)
from recsvc.checks import ParamError

ML20M_FILES = ("ratings.csv", "rating.csv")  # GroupLens, Kaggle
ML20M_FORMAT = "a CSV with header userId,movieId,rating,timestamp (GroupLens ratings.csv or Kaggle rating.csv)"
UDATA_FORMAT = "GroupLens u.data: tab-separated user id, item id, rating, timestamp; no header"
INTER_FORMAT = "RecBole ml-100k.inter: header user_id:token<TAB>item_id:token<TAB>rating:float<TAB>timestamp:float"
INTER_HEADER = ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]

RECBOLE_WHEEL = "recbole==1.2.1"
RECBOLE_WHEEL_FILE = "recbole-1.2.1-py3-none-any.whl"
RECBOLE_INTER = "recbole/dataset_example/ml-100k/ml-100k.inter"


def _rated(df: pl.DataFrame, path: Path | str, expected: str) -> Interactions:
    df = integer_ids(df, ["user", "item"], path, expected)
    df = cast_checked(df, "rating", pl.Float64, path, expected)
    return Interactions(df.select("user", "item", "rating"), source=str(path))


def _header_body(lines: pl.DataFrame, path: Path | str, header: list[str], fmt: str) -> pl.DataFrame:
    first = lines.drop_nulls("line").row(0, named=True)
    got = [h.strip() for h in first["line"].split("\t" if "\t" in first["line"] else ",")]
    if got != header:
        raise fail_at(path, first["line_no"], first["line"], f"the header {','.join(header)} ({fmt})")
    return lines.filter(pl.col("line_no") > first["line_no"])


def _header_line(path: Path, header: list[str], fmt: str) -> tuple[int, int]:
    """Checks the first non-blank line is ``header``; returns (its line number, the byte after it)."""
    offset = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            offset += len(raw)
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise DataError(f"{path} could not be read as text ({exc}); expected {fmt}") from None
            if not text:
                continue
            got = [h.strip() for h in text.split("\t" if "\t" in text else ",")]
            if got != header:
                raise fail_at(path, line_no, text, f"the header {','.join(header)} ({fmt})")
            return line_no, offset
    raise DataError(f"{path} is empty; expected {fmt}")


def _ml20m_line(path: Path) -> fastparse.SlowLine:
    """The full rules for one line the scanner does not take (blanks around fields, signs, …)."""
    expected = "4 comma-separated fields userId,movieId,rating,timestamp"

    def parse_line(text: str, line_no: int, movie: int) -> tuple[int, int, int, float]:
        line = text.strip()
        if not line:
            return 0, 0, 0, 0.0
        row = pl.DataFrame({"line_no": [line_no], "line": [line]})
        df = split_fields(row, ",", ["user", "item", "rating", "timestamp"], path, expected)
        df = cast_checked(integer_ids(df, ["user", "item"], path, expected), "rating", pl.Float64, path, expected)
        return 2, int(df["user"][0]), int(df["item"][0]), float(df["rating"][0])

    return parse_line


def parse_ml20m(path: Path) -> Ratings:
    """Streams ``ratings.csv`` (20 M lines) block by block into integer arrays."""
    require_file(path, ML20M_FORMAT)
    line_no, offset = _header_line(path, ["userId", "movieId", "rating", "timestamp"], ML20M_FORMAT)
    got = fastparse.parse(path, fastparse.CSV4, _ml20m_line(path), first_line=line_no + 1, skip_bytes=offset)
    return Ratings(got.users, got.items, got.ratings, str(path))


def load_ml20m(data_dir: Path | None) -> Ratings:
    if data_dir is None:
        raise ParamError("ml-20m needs {data_dir}: a directory containing {files}", files=" or ".join(ML20M_FILES))
    for name in ML20M_FILES:
        if (data_dir / name).is_file():
            return parse_ml20m(data_dir / name)
    raise DataError(f"data file {data_dir / ML20M_FILES[0]} not found; expected {ML20M_FORMAT}")


def parse_udata(path: Path) -> Interactions:
    expected = "4 tab-separated fields: user id, item id, rating, timestamp"
    df = split_fields(read_lines(path, UDATA_FORMAT), "\t", ["user", "item", "rating", "ts"], path, expected)
    return _rated(df, path, expected)


def parse_inter(source: Path | bytes, path: Path | str) -> Interactions:
    lines = lines_from_source(source, path, INTER_FORMAT)
    body = _header_body(lines, path, INTER_HEADER, INTER_FORMAT)
    expected = "4 tab-separated fields: user_id, item_id, rating, timestamp"
    df = split_fields(body, "\t", ["user", "item", "rating", "ts"], path, expected)
    return _rated(df, path, expected)


def cache_dir() -> Path:
    return Path(os.environ.get("RECSVC_CACHE") or Path.home() / ".cache" / "recsvc" / "wheels")


def _pip_python() -> str:
    """An interpreter with pip: this one, or, in a venv made without pip (scripts/setup.sh makes
    one: uv installs into it), the interpreter it was made from, whose pip has the machine's index
    settings."""
    if importlib.util.find_spec("pip") is not None:
        return sys.executable
    return getattr(sys, "_base_executable", None) or sys.executable


def recbole_wheel() -> Path:
    """The recbole wheel in the cache, downloaded (without installing it) only if missing."""
    cache = cache_dir()
    wheel = cache / RECBOLE_WHEEL_FILE
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [_pip_python(), "-m", "pip", "download", "--no-deps", "--only-binary=:all:", RECBOLE_WHEEL, "-d", str(cache)]
    print(f"fetching the embedded ml-100k copy: {' '.join(cmd[2:])}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ParamError(
            "could not download {wheel} into {cache} ({reason}); "
            "expected network access to the package index, or pass {data_dir} with u.data or ml-100k.inter",
            wheel=RECBOLE_WHEEL,
            cache=str(cache),
            reason=tail[0],
        )
    return wheel


def load_ml100k(data_dir: Path | None) -> Interactions:
    if data_dir is not None:
        if (data_dir / "u.data").is_file():
            return parse_udata(data_dir / "u.data")
        if (data_dir / "ml-100k.inter").is_file():
            return parse_inter(data_dir / "ml-100k.inter", data_dir / "ml-100k.inter")
        raise DataError(f"data file {data_dir / 'u.data'} not found; expected {UDATA_FORMAT}, or {INTER_FORMAT}")
    wheel = recbole_wheel()
    where = f"{wheel}!{RECBOLE_INTER}"
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(RECBOLE_INTER)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise DataError(f"{where} could not be read ({exc}); delete {wheel} to fetch it again") from exc
    return parse_inter(data, where)
