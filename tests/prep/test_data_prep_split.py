"""Filter and split rules: sizes, seed determinism, 80/20 per held-out user, disjointness, weak split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from data_prep.datasets import DataError, load
from data_prep.matrix import from_frame
from data_prep.split import filter_implicit, sample_population, strong_split, weak_split
from data_prep.testing import write_amazon


def _implicit(users: int = 60, seed: int = 1) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [
        (f"{u}", f"{i}") for u in range(users) for i in rng.choice(40, size=int(rng.integers(5, 26)), replace=False)
    ]
    return pl.DataFrame(rows, schema=["user", "item"], orient="row")


def _pairs(m, user_ids, item_ids) -> set[tuple[str, str]]:
    coo = m.tocoo()
    return {(user_ids[r], item_ids[c]) for r, c in zip(coo.row, coo.col, strict=False)}


def test_filter_keeps_ratings_4_plus_and_users_with_5() -> None:
    df = pl.DataFrame(
        {
            "user": ["a"] * 6 + ["b"] * 6 + ["c"] * 5,
            "item": ["1", "2", "3", "4", "5", "5", "1", "2", "3", "4", "5", "6", "1", "2", "3", "4", "5"],
            "rating": [4.0, 5, 4.5, 4, 5, 5, 5.0, 5, 5, 5, 3.5, 1, 4.0, 4, 4, 4, 4],
        }
    )
    out = filter_implicit(df, explicit=True, source="t")
    # a: duplicate (a,5) dropped → 5 left, kept. b: only 4 ratings ≥ 4 → dropped. c: exactly 5 → kept.
    assert sorted(out["user"].unique().to_list()) == ["a", "c"]
    assert out.filter(pl.col("user") == "a").height == 5
    assert out.columns == ["user", "item"]
    with pytest.raises(DataError, match="no interactions left after filtering"):
        filter_implicit(df.with_columns(pl.lit(3.0).alias("rating")), explicit=True, source="t")


def test_strong_split_rules() -> None:
    df = _implicit()
    s = strong_split(from_frame(df, 0), test_users=10, val_users=8, seed=42, source="t")
    test, val = s.test, s.validation
    assert val is not None  # a strong split has a validation group
    assert len(test.user_ids) == 10 and len(val.user_ids) == 8 and s.train.shape[0] == 42
    all_users = set(df["user"].to_list())
    groups = [set(test.user_ids), set(val.user_ids), set(s.train_user_ids)]
    assert set.union(*groups) == all_users and sum(map(len, groups)) == len(all_users)  # disjoint
    assert list(test.user_ids) == sorted(test.user_ids)
    truth = {u: set(g["item"].to_list()) for (u,), g in df.group_by("user")}
    for group in (test, val):
        assert group.targets is not None
        n_in = np.diff(group.inputs.indptr)
        n_tg = np.diff(group.targets.indptr)
        for r, u in enumerate(group.user_ids):
            n = len(truth[u])
            assert n_tg[r] == int(np.floor(0.2 * n)) and n_in[r] == n - n_tg[r]
        got_in, got_tg = (
            _pairs(group.inputs, group.user_ids, s.item_ids),
            _pairs(group.targets, group.user_ids, s.item_ids),
        )
        assert not got_in & got_tg
        assert got_in | got_tg == {(u, i) for u in group.user_ids for i in truth[u]}
    assert _pairs(s.train, s.train_user_ids, s.item_ids) == {(u, i) for u in s.train_user_ids for i in truth[u]}
    assert list(s.item_ids) == sorted(s.item_ids, key=int)


def test_strong_split_is_deterministic_and_order_free() -> None:
    df = _implicit()
    a = strong_split(from_frame(df, 0), 10, 8, 42, "t")
    b = strong_split(from_frame(df.sample(fraction=1.0, shuffle=True, seed=3), 0), 10, 8, 42, "t")
    c = strong_split(from_frame(df, 0), 10, 8, 7, "t")
    assert list(a.test.user_ids) == list(b.test.user_ids)
    assert a.test.targets is not None and b.test.targets is not None
    assert a.validation is not None and b.validation is not None
    assert (a.test.targets != b.test.targets).nnz == 0 and (a.validation.inputs != b.validation.inputs).nnz == 0
    assert list(a.test.user_ids) != list(c.test.user_ids)


def test_too_few_users() -> None:
    with pytest.raises(
        DataError, match=r"60 users after filtering, fewer than the split needs \(50 test \+ 10 validation"
    ):
        strong_split(from_frame(_implicit(), 0), 50, 10, 42, "t")


def test_weak_split_amazon(tmp_path: Path) -> None:
    write_amazon(tmp_path, {0: [1, 2, 3], 1: [2, 4], 2: [5, 1], 3: [9]}, {0: [4], 1: [1, 3], 2: []})
    raw = load("amazon-book", tmp_path)
    s = weak_split(filter_implicit(raw.df, explicit=False, source="t"), "t")
    assert s.validation is None
    assert list(s.train_user_ids) == ["0", "1", "2", "3"] and s.train.nnz == 8
    assert list(s.test.user_ids) == ["0", "1"]  # users with targets
    assert _pairs(s.test.inputs, s.test.user_ids, s.item_ids) == {
        ("0", "1"),
        ("0", "2"),
        ("0", "3"),
        ("1", "2"),
        ("1", "4"),
    }
    assert _pairs(s.test.targets, s.test.user_ids, s.item_ids) == {("0", "4"), ("1", "1"), ("1", "3")}
    pop = sample_population(s, 3, seed=42)
    assert len(pop.user_ids) == 3 and set(pop.user_ids) <= {"0", "1", "2", "3"}
    assert list(sample_population(s, 3, seed=42).user_ids) == list(pop.user_ids)
    rows = [list(s.train_user_ids).index(u) for u in pop.user_ids]
    assert (pop.inputs != s.train[rows]).nnz == 0
