"""Implicit-feedback filter and the train / validation / test splits, as SANSA's code does
(docs/reference/specification.md §4).

Strong generalisation: users are shuffled with the seed; the first ``test_users`` are test
users, the next ``val_users`` validation users, the rest train. Each held-out user keeps a
random 80% of their items as fold-in input and floor(20%) as targets. Weak generalisation
(amazon-book): fixed files say which interactions are targets.

Users and items are ordered canonically (numeric ids numerically, others lexicographically)
before any randomness, so the split depends only on the data's content and the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import scipy.sparse as sp

from data_prep.datasets.base import DataError

TARGET_FRACTION = 0.2
MIN_USER_INTERACTIONS = 5
MIN_RATING = 4.0


@dataclass(frozen=True)
class UserGroup:
    """Rows of users (sorted by id): their input (fold-in) items and their target items."""

    user_ids: np.ndarray  # str
    inputs: sp.csr_matrix  # users × items, binary float32
    targets: sp.csr_matrix | None  # None for a population without targets


@dataclass(frozen=True)
class Split:
    item_ids: np.ndarray  # str, column order of every matrix
    train: sp.csr_matrix  # training users × items (the public data SANSA is fitted on)
    train_user_ids: np.ndarray  # str, row order of ``train``
    test: UserGroup
    validation: UserGroup | None  # None under weak generalisation

    def sizes(self) -> dict[str, int]:
        out = {
            "items": len(self.item_ids),
            "train_users": self.train.shape[0],
            "train_interactions": int(self.train.nnz),
            "test_users": len(self.test.user_ids),
            "test_input_interactions": int(self.test.inputs.nnz),
            "test_target_interactions": int(self.test.targets.nnz) if self.test.targets is not None else 0,
        }
        if self.validation is not None:
            out["validation_users"] = len(self.validation.user_ids)
            out["validation_input_interactions"] = int(self.validation.inputs.nnz)
        return out


def filter_implicit(df: pl.DataFrame, explicit: bool, source: str) -> pl.DataFrame:
    """rating ≥ 4 → 1 and users with ≥ 5 interactions (explicit data); duplicates dropped."""
    if explicit:
        df = df.filter(pl.col("rating") >= MIN_RATING)
    keys = ["user", "item", "target"] if "target" in df.columns else ["user", "item"]
    df = df.unique(keys, maintain_order=True)
    if explicit:
        df = df.filter(pl.len().over("user") >= MIN_USER_INTERACTIONS)
    if df.height == 0:
        rule = (
            f"rating ≥ {MIN_RATING:g} and users with ≥ {MIN_USER_INTERACTIONS} such interactions"
            if explicit
            else "de-duplication"
        )
        raise DataError(f"{source}: no interactions left after filtering ({rule}); expected a non-empty dataset")
    return df.select(keys)


def canonical_order(ids: pl.Series) -> np.ndarray:
    """Unique ids sorted numerically when all are integers, else lexicographically."""
    uniq = ids.unique()
    as_int = uniq.cast(pl.Int64, strict=False)
    if as_int.null_count() == 0:
        return uniq.gather(as_int.arg_sort()).to_numpy().astype(str)
    return uniq.sort().to_numpy().astype(str)


def _index(values: pl.Series, ids: np.ndarray) -> np.ndarray:
    lookup = pl.DataFrame({"_id": ids, "_ix": np.arange(len(ids), dtype=np.int64)})
    out = pl.DataFrame({"_id": values}).join(lookup, on="_id", how="left", maintain_order="left")["_ix"]
    return out.to_numpy()


def to_csr(df: pl.DataFrame, user_ids: np.ndarray, item_ids: np.ndarray) -> sp.csr_matrix:
    rows = _index(df["user"], user_ids)
    cols = _index(df["item"], item_ids)
    m = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(user_ids), len(item_ids)))
    m.sum_duplicates()
    m.sort_indices()
    return m


def _group(df: pl.DataFrame, users: np.ndarray, item_ids: np.ndarray, with_targets: bool) -> UserGroup:
    users = np.sort(users)
    sub = df.filter(pl.col("user").is_in(pl.Series(users).implode()))
    if not with_targets:
        return UserGroup(users, to_csr(sub, users, item_ids), None)
    return UserGroup(
        users,
        to_csr(sub.filter(~pl.col("target")), users, item_ids),
        to_csr(sub.filter(pl.col("target")), users, item_ids),
    )


def mark_targets(df: pl.DataFrame, rng: np.random.Generator, fraction: float = TARGET_FRACTION) -> pl.DataFrame:
    """Marks floor(fraction·n_u) random interactions of each user as targets."""
    df = df.sort(["user", "item"])
    return (
        df.with_columns(pl.Series("_key", rng.random(df.height)))
        .with_columns(
            (pl.col("_key").rank("ordinal").over("user") <= (pl.len().over("user") * fraction).floor()).alias("target")
        )
        .drop("_key")
    )


def strong_split(df: pl.DataFrame, test_users: int, val_users: int, seed: int, source: str) -> Split:
    """Disjoint test / validation / train users; 80/20 fold-in/targets for held-out users."""
    users = canonical_order(df["user"])
    if test_users < 1 or val_users < 0:
        raise DataError(f"need ≥ 1 test user and ≥ 0 validation users, got {test_users} and {val_users}")
    if len(users) <= test_users + val_users:
        raise DataError(
            f"{source}: {len(users)} users after filtering, fewer than the split needs "
            f"({test_users} test + {val_users} validation + at least 1 training user)"
        )
    item_ids = canonical_order(df["item"])
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(users))
    test_u, val_u, train_u = (
        users[perm[:test_users]],
        users[perm[test_users : test_users + val_users]],
        np.sort(users[perm[test_users + val_users :]]),
    )
    held = mark_targets(df.filter(~pl.col("user").is_in(pl.Series(train_u).implode())), rng)
    train = to_csr(df.filter(pl.col("user").is_in(pl.Series(train_u).implode())), train_u, item_ids)
    validation = _group(held, val_u, item_ids, True) if val_users else None
    return Split(item_ids, train, train_u, _group(held, test_u, item_ids, True), validation)


def weak_split(df: pl.DataFrame, source: str) -> Split:
    """amazon-book: training = all non-target rows; test users = users with targets."""
    item_ids = canonical_order(df["item"])
    train_df = df.filter(~pl.col("target"))
    if train_df.height == 0:
        raise DataError(f"{source}: train.txt has no interactions; expected 'user item item …' lines")
    test_u = canonical_order(df.filter(pl.col("target"))["user"])
    if len(test_u) == 0:
        raise DataError(f"{source}: test.txt has no target interactions; expected 'user item item …' lines")
    train_u = canonical_order(train_df["user"])
    return Split(item_ids, to_csr(train_df, train_u, item_ids), train_u, _group(df, test_u, item_ids, True), None)


def sample_population(split: Split, users: int, seed: int) -> UserGroup:
    """A seeded sample of training users (with their full rows) for weak generalisation."""
    n = split.train.shape[0]
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xB00C,)))
    rows = np.sort(rng.choice(n, size=min(users, n), replace=False))
    return UserGroup(split.train_user_ids[rows], split.train[rows], None)
