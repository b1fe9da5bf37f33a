"""Paper-scale prep: every streaming path equals, on small data, the in-memory result it replaces."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from data_prep.datasets.synthetic import BLOCK_USERS, Sampler, config_for, generate, generate_matrix
from data_prep.matrix import compact, from_frame, from_pairs
from data_prep.split import MIN_USER_INTERACTIONS, Split, UserGroup, filter_implicit, strong_split
from data_prep.testing import strong_split_frame


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
    fmt = {"int": str, "name": lambda v: f"u{v}"}[ids]
    return pl.DataFrame(
        {
            "user": [fmt(v) for v in u.tolist()],
            "item": [fmt(v) if ids == "int" else f"i{v}" for v in i.tolist()],
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
