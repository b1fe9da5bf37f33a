"""Loaders on fixture files in each dataset's exact original format, plus malformed input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from data_prep.datasets import DataError, amazon_book, load, movielens, netflix
from data_prep.datasets.synthetic import PRESETS, config_for, generate
from data_prep.testing import ratings_table, triples, write_amazon, write_inter, write_ml20m, write_netflix, write_udata
from recsvc.checks import ParamError


@pytest.fixture(scope="module")
def table() -> pl.DataFrame:
    return ratings_table()


@pytest.mark.parametrize("kaggle", [False, True])
def test_ml20m_grouplens_and_kaggle(tmp_path: Path, table: pl.DataFrame, kaggle: bool) -> None:
    write_ml20m(tmp_path, table, kaggle=kaggle)
    got = load("ml-20m", tmp_path)
    assert got.df.height == table.height
    assert triples(got.df) == triples(table)


def test_ml100k_udata_and_inter(tmp_path: Path, table: pl.DataFrame) -> None:
    write_udata(tmp_path / "a", table)
    write_inter(tmp_path / "b", table)
    for d in ("a", "b"):
        got = load("ml-100k", tmp_path / d)
        assert triples(got.df) == {
            (u, i, float(int(r))) for u, i, r in table.select("user", "item", "rating").iter_rows()
        }


def test_netflix_four_files(tmp_path: Path, table: pl.DataFrame) -> None:
    paths = write_netflix(tmp_path, table)
    assert paths[0].read_text().splitlines()[0].endswith(":")
    got = load("netflix", tmp_path)
    assert got.df.height == table.height
    assert triples(got.df) == {(u, i, float(int(r))) for u, i, r in table.select("user", "item", "rating").iter_rows()}


def test_amazon_book_marks_targets(tmp_path: Path) -> None:
    write_amazon(tmp_path, {0: [1, 2, 3], 1: [2, 4], 7: [5]}, {0: [4], 1: [1, 3], 7: []})
    df = load("amazon-book", tmp_path).df
    assert set(df.filter(~pl.col("target")).select("user", "item").iter_rows()) == {
        ("0", "1"),
        ("0", "2"),
        ("0", "3"),
        ("1", "2"),
        ("1", "4"),
        ("7", "5"),
    }
    assert set(df.filter(pl.col("target")).select("user", "item").iter_rows()) == {("0", "4"), ("1", "1"), ("1", "3")}
    assert df["rating"].null_count() == df.height  # implicit data


def test_missing_files_name_the_file_and_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"ratings\.csv not found; expected a CSV with header userId,movieId"):
        load("ml-20m", tmp_path)
    with pytest.raises(DataError, match=r"combined_data_1\.txt not found; expected Netflix"):
        load("netflix", tmp_path)
    with pytest.raises(DataError, match=r"train\.txt not found; expected LightGCN"):
        load("amazon-book", tmp_path)
    with pytest.raises(DataError, match=r"u\.data not found; expected GroupLens u\.data"):
        load("ml-100k", tmp_path)


def test_malformed_lines_report_file_and_line(tmp_path: Path, table: pl.DataFrame) -> None:
    path = write_ml20m(tmp_path / "ml", table)
    lines = path.read_text().splitlines()
    lines[5] = "1,2,3"  # line 6: a field missing
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"ratings\.csv, line 6: malformed line '1,2,3'; expected 4 comma-separated"):
        movielens.parse_ml20m(path)
    lines[5] = "1,abc,4.0,123"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 6: .*item 'abc' is not valid"):
        movielens.parse_ml20m(path)
    path.write_text("user,movie,rating,ts\n1,2,4.0,5\n")
    with pytest.raises(DataError, match=r"line 1: .*expected the header userId,movieId,rating,timestamp"):
        movielens.parse_ml20m(path)

    nf = tmp_path / "nf.txt"
    nf.write_text("1:\n10,5,2005-01-01\n10,five,2005-01-02\n")
    with pytest.raises(DataError, match=r"nf\.txt, line 3: .*rating 'five' is not valid"):
        netflix.parse_file(nf)
    nf.write_text("10,5,2005-01-01\n")
    with pytest.raises(DataError, match=r"line 1: .*expected a 'MovieID:' line"):
        netflix.parse_file(nf)

    ab = tmp_path / "train.txt"
    ab.write_text("0 1 2\n1 x 3\n")
    with pytest.raises(DataError, match=r"train\.txt, line 2: malformed line '1 x 3'"):
        amazon_book.parse_file(ab, False)

    ud = tmp_path / "u.data"
    ud.write_text("1\t2\t4\t5\n\n1 2 4 5\n")
    with pytest.raises(DataError, match=r"u\.data, line 3: .*4 tab-separated fields"):
        movielens.parse_udata(ud)


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "u.data").write_text("")
    with pytest.raises(DataError, match=r"u\.data is empty; expected GroupLens"):
        load("ml-100k", tmp_path)


def test_synthetic_is_seeded_power_law() -> None:
    cfg = config_for("small", None, None, None)
    a, b = generate(cfg, 42).df, generate(cfg, 42).df
    assert a.equals(b)
    assert not a.equals(generate(cfg, 43).df)
    assert a.select("user", "item").is_unique().all()
    per_user = a.group_by("user").len()["len"].to_numpy()
    per_item = a.group_by("item").len()["len"].sort(descending=True).to_numpy()
    assert per_user.min() >= cfg.min_per_user and a["user"].n_unique() == cfg.users
    assert 0.8 * cfg.interactions < a.height <= cfg.interactions
    # Heavy tails: the top 1% of items hold far more than 1% of the interactions.
    assert per_item[: len(per_item) // 100].sum() > 0.1 * a.height
    assert per_user.max() > 5 * np.median(per_user)
    assert PRESETS["ml20m-shape"].users == 136_677 and PRESETS["ml20m-shape"].items == 20_720
    with pytest.raises(ParamError, match=r"^unknown synthetic preset 'huge'; expected preset one of "):
        config_for("huge", None, None, None)  # `recsvc prep --preset huge` names --preset (test_data_prep_validation)


def test_netflix_prize_training_set_with_messy_whitespace(tmp_path: Path, table: pl.DataFrame) -> None:
    """The Prize's own layout (training_set/mv_<7 digits>.txt, one movie each), with CRLF endings,
    a header with trailing blanks and whitespace-only lines: the same interactions."""
    d = tmp_path / "training_set"
    d.mkdir()
    for movie in sorted(table["item"].unique().to_list(), key=int):
        rows = [
            f"{u},{int(r)},{np.datetime64(ts, 's').astype('datetime64[D]')}"
            for u, _, r, ts in table.filter(pl.col("item") == movie).iter_rows()
        ]
        (d / f"mv_{int(movie):07d}.txt").write_bytes(("\r\n".join([f"{movie}:  ", *rows, "   ", ""])).encode())
    got = load("netflix", tmp_path)
    assert got.df.height == table.height
    assert triples(got.df) == {(u, i, float(int(r))) for u, i, r in table.select("user", "item", "rating").iter_rows()}


def test_whitespace_only_lines_are_blank_in_every_format(tmp_path: Path, table: pl.DataFrame) -> None:
    path = write_ml20m(tmp_path / "ml", table)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:3], "   ", "\t", *lines[3:]]) + "\n")
    assert triples(load("ml-20m", tmp_path / "ml").df) == triples(table)
    write_amazon(tmp_path / "ab", {0: [1, 2], 1: [3]}, {0: [3], 1: [1]})
    train = tmp_path / "ab" / "train.txt"
    train.write_text("  \n" + train.read_text().replace("\n", "  \r\n") + " \t \n")
    df = load("amazon-book", tmp_path / "ab").df
    assert set(df.filter(~pl.col("target")).select("user", "item").iter_rows()) == {("0", "1"), ("0", "2"), ("1", "3")}
