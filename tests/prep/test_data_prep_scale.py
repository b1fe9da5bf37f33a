"""Paper-scale prep: every streaming path equals, on small data, the in-memory result it replaces."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

import data_prep.pipeline as pipeline
from data_prep import memory
from data_prep.datasets import DataError, Ratings, fastparse, movielens, netflix
from data_prep.datasets.synthetic import BLOCK_USERS, Sampler, config_for, generate, generate_matrix
from data_prep.matrix import compact, from_frame, from_pairs
from data_prep.memory import parse_size
from data_prep.split import MIN_USER_INTERACTIONS, Split, UserGroup, filter_implicit, implicit_matrix, strong_split
from data_prep.testing import ml20m_table, netflix_table, ratings_table, strong_split_frame, write_ml20m, write_netflix
from recsvc.app.cli import main
from recsvc.artifact import read_manifest


def _same_csr(a: sp.csr_matrix, b: sp.csr_matrix) -> None:
    assert a.shape == b.shape and a.indices.dtype == b.indices.dtype == np.int32
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.data, b.data) and a.data.dtype == b.data.dtype == np.float32


def _same_group(a: UserGroup | None, b: UserGroup | None) -> None:
    assert a is not None and b is not None
    assert a.user_ids.tolist() == b.user_ids.tolist()
    _same_csr(a.inputs, b.inputs)
    assert a.targets is not None and b.targets is not None
    _same_csr(a.targets, b.targets)


def _same_split(a: Split, b: Split) -> None:
    assert a.item_ids.tolist() == b.item_ids.tolist()
    assert a.train_user_ids.tolist() == b.train_user_ids.tolist()
    _same_csr(a.train, b.train)
    _same_group(a.test, b.test)
    _same_group(a.validation, b.validation)
    assert a.sizes() == b.sizes()


def _messy_ratings(n: int, users: int, items: int, seed: int, ids: str) -> pl.DataFrame:
    """Duplicates, low ratings, users below 5 interactions, items only such users rated."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, users, n) ** 2 % (users * 7)  # sparse, unordered ids (dense-table path and gaps)
    i = rng.zipf(1.3, n) % items + 3
    prefix = "" if ids == "int" else "u"
    return pl.DataFrame(
        {
            "user": [f"{prefix}{v}" for v in u.tolist()],
            "item": [f"{v}" if ids == "int" else f"i{v}" for v in i.tolist()],
            "rating": rng.integers(1, 6, n).astype(np.float64),
        }
    )


@pytest.mark.parametrize("ids", ["int", "name"])
def test_matrix_split_equals_table_split(ids: str) -> None:
    # String ids sort differently as numbers ("10" < "9" as strings): every group's row order
    # and the targets' random keys follow the strings, as the table split did.
    df = filter_implicit(_messy_ratings(20_000, 900, 300, 1, ids), True, "t")
    for seed, n_test, n_val in ((42, 60, 40), (7, 1, 0)):
        want = strong_split_frame(df, n_test, n_val, seed)
        got = strong_split(from_frame(df, 0), n_test, n_val, seed, "t")
        if n_val:
            _same_split(got, want)
        else:
            assert got.validation is None and want.validation is None
            _same_group(got.test, want.test)
            _same_csr(got.train, want.train)


def test_integer_pairs_equal_the_filtered_table() -> None:
    """from_pairs (integer arrays: the large loaders' and the sort-based id paths) builds exactly
    filter_implicit + from_frame's matrix, ids included."""
    raw = _messy_ratings(30_000, 1500, 400, 2, "int")
    want = from_frame(filter_implicit(raw, True, "t"), 0)
    liked = raw.filter(pl.col("rating") >= 4)
    users, items = liked["user"].cast(pl.Int64).to_numpy(), liked["item"].cast(pl.Int64).to_numpy()
    for shift in (0, 10**12):  # dense id table, then np.unique for ids too spread out for one
        got = from_pairs(users + shift, items, MIN_USER_INTERACTIONS)
        assert (got.user_ids.astype(np.int64) - shift).astype(str).tolist() == want.user_ids.tolist()
        assert got.item_ids.tolist() == want.item_ids.tolist()
        _same_csr(got.x, want.x)
    assert want.x.getnnz(axis=1).min() >= MIN_USER_INTERACTIONS and want.x.getnnz(axis=0).min() >= 1


def test_synthetic_blocks_are_pure_and_match_the_table() -> None:
    cfg = config_for("small", 2 * BLOCK_USERS + 100, 500, 5 * (2 * BLOCK_USERS + 100) + 50_000)
    x = generate_matrix(cfg, 3)
    assert x.indices.dtype == np.int32 and x.shape == (cfg.users, cfg.items)
    block = Sampler.create(cfg, 3).block(1)  # alone, in a fresh sampler: the same rows
    _same_csr(block, x[BLOCK_USERS : 2 * BLOCK_USERS])
    df = generate(cfg, 3).df
    assert df.height == x.nnz and df["user"].n_unique() == cfg.users
    # The pipeline filters the generated matrix as filter_implicit filters the table.
    want = from_frame(filter_implicit(df, True, "t"), 0)
    ids = np.arange(cfg.users)
    got = compact(x, ids, ids[: cfg.items], MIN_USER_INTERACTIONS)
    assert 0 < len(ids) - len(got.user_ids) < 100  # a few users lost duplicates below 5 items
    assert got.user_ids.tolist() == want.user_ids.tolist() and got.item_ids.tolist() == want.item_ids.tolist()
    _same_csr(got.x, want.x)


# Lines the scanner leaves to the line rules: blanks around fields, CRLF, signs, long decimals,
# an empty date, whitespace-only lines.
MESSY_NETFLIX = ["  77:\r", " 12 , 4 ,2005-01-01\r", "+13,5,2005-01-02", "", "   ", "14,4.25,", "15,3.5,2005-02-02"]
MESSY_ML20M = [" 12 , 77 , 4.0 , 1\r", "+13,77,5,2005-01-02 10:00:00", "", "14,78,4.25,", "15,78,3.5,9"]


def _append(path: Path, lines: list[str], at: int) -> None:
    text = path.read_text().splitlines()
    path.write_text("\n".join(text[:at] + lines + text[at:]) + "\n")


def _same_ratings(got: Ratings, want: pl.DataFrame) -> None:
    assert got.users.dtype == got.items.dtype == np.int32 and got.ratings.dtype == np.float32
    assert got.df.to_dicts() == want.with_columns(pl.col("rating").cast(pl.Float32).cast(pl.Float64)).to_dicts()


@pytest.mark.parametrize("block", [fastparse.BLOCK_BYTES, 41])
def test_streaming_loaders_equal_the_whole_file_tables(
    tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Block by block (41 bytes: every line crosses a block edge) equals the whole-file table, row for row."""
    monkeypatch.setattr(fastparse, "BLOCK_BYTES", block)
    table = ratings_table(users=60, items=30)
    nf = write_netflix(tmp_path / "nf", table)[1]
    _append(nf, MESSY_NETFLIX, 7)
    _same_ratings(netflix.parse_file(nf), netflix_table(nf))
    ml = write_ml20m(tmp_path / "ml", table)
    _append(ml, MESSY_ML20M, 9)
    _append(ml, ["", "  "], 0)  # blank lines before the header
    got = movielens.parse_ml20m(ml)
    _same_ratings(got, ml20m_table(ml))
    # The pipeline's filter on arrays equals filter_implicit on the table.
    want = from_frame(filter_implicit(ml20m_table(ml), True, "t"), 0)
    m = implicit_matrix(got, True)
    assert m.user_ids.tolist() == want.user_ids.tolist() and m.item_ids.tolist() == want.item_ids.tolist()
    _same_csr(m.x, want.x)


@pytest.mark.parametrize("block", [fastparse.BLOCK_BYTES, 64])
def test_truncated_or_malformed_big_files_name_file_and_line(
    tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastparse, "BLOCK_BYTES", block)
    table = ratings_table(users=40, items=20)
    nf = write_netflix(tmp_path / "nf", table)[0]
    text = nf.read_bytes()
    n_lines = text.count(b"\n")
    nf.write_bytes(text[: text.rindex(b",")])  # cut inside the last line: 'CustomerID,Rating'
    last = nf.read_text().splitlines()[-1]
    msg = rf"{nf.name}, line {n_lines}: malformed line '{last}'; expected 'CustomerID,Rating,Date'"
    with pytest.raises(DataError, match=msg):
        netflix.parse_file(nf)
    with pytest.raises(DataError, match=msg):
        netflix_table(nf)  # the same message as the whole-file table gives
    ml = write_ml20m(tmp_path / "ml", table)
    lines = ml.read_text().splitlines()
    lines[70] = "5,6,four,7"
    ml.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DataError, match=r"ratings\.csv, line 71: malformed line '5,6,four,7'.*rating 'four' is not valid"
    ):
        movielens.parse_ml20m(ml)
    ml.write_bytes(b"userId,movieId,rating,timestamp\n1,2,\xff4.0,5\n")
    with pytest.raises(DataError, match=r"ratings\.csv, line 2: not UTF-8 text"):
        movielens.parse_ml20m(ml)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--dataset", "synthetic", "--preset", "netflix-shape", "--memory-limit", "6GiB"],
            r"this run needs an estimated 8\.\d GiB, more than --memory-limit 6\.0 GiB; expected a larger "
            r"--memory-limit.*100,000,000 interactions and 17,770 items",
        ),
        (
            ["--dataset", "synthetic", "--preset", "tiny", "--memory-limit", "12 gigs"],
            r"--memory-limit '12 gigs' is not a size",
        ),
    ],
)
def test_memory_limit_refuses_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prep_error_line, args: list[str], message: str
) -> None:
    def forbidden(*a, **k):
        raise AssertionError("work started before the memory check")

    monkeypatch.setattr(pipeline, "_connect", forbidden)
    monkeypatch.setattr(pipeline, "_load_and_split", forbidden)
    assert main(["prep", *args, "--out", str(tmp_path / "a" / "o")]) == 2
    assert re.search(message, prep_error_line())
    assert list(tmp_path.iterdir()) == []


def test_memory_estimate_from_sizes_and_files(tmp_path: Path) -> None:
    assert [parse_size(s) for s in ("12GiB", "12g", "1.5 MiB", "4096")] == [12 << 30, 12 << 30, 3 << 19, 4096]
    small = memory.estimate(10**6, 17_770, "cholmod", False, 1000, 2)
    big = memory.estimate(10**8, 17_770, "cholmod", False, 1000, 2)
    assert small.peak < big.peak < 12 << 30  # the netflix-shape target fits its own estimate
    assert memory.estimate(10**8, 17_770, "icf", False, 1000, 2).fit < big.fit
    assert memory.estimate(10**8, 17_770, "cholmod", True, 1000, 2).load_split > big.load_split
    (tmp_path / "ratings.csv").write_bytes(b"x" * 2800)
    assert memory.file_interactions("ml-20m", tmp_path) == 100 and memory.file_interactions("netflix", tmp_path) == 0


def test_netflix_prep_end_to_end_splits_as_the_tables_do(tmp_path: Path) -> None:
    """`recsvc prep --dataset netflix` (streamed loader → int32 matrix → split) on fixture files
    splits exactly as the whole-file tables → filter_implicit → table split do."""
    files = write_netflix(tmp_path / "nf", ratings_table(users=200, items=40, per_user=(8, 30)))
    out = tmp_path / "art"
    args = ["--test-users", "20", "--val-users", "20", "--workers", "1", "--memory-limit", "4GiB"]
    assert main(["prep", "--dataset", "netflix", "--data-dir", str(tmp_path / "nf"), "--out", str(out), *args]) == 0
    table = filter_implicit(pl.concat([netflix_table(f) for f in files]), True, "t")
    want = strong_split_frame(table, 20, 20, 42)
    split = read_manifest(out).split
    assert split is not None and split.to_dict() | {"kind": None, "target_fraction": None} == want.sizes() | {
        "kind": None,
        "target_fraction": None,
    }
    inputs = pl.read_parquet(out / "test_inputs.parquet")
    assert sorted(inputs["user_id"].unique().to_list()) == sorted(want.test.user_ids.tolist())
    assert inputs.height == want.test.inputs.nnz
