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

from data_prep.datasets.base import DataError, Ratings
from data_prep.matrix import RatingMatrix, canonical_order, from_pairs, positions

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


def implicit_matrix(raw: Ratings, explicit: bool) -> RatingMatrix:
    """:func:`filter_implicit`'s rules on rating arrays, straight into the matrix (large data)."""
    keep = raw.ratings >= MIN_RATING if explicit else np.ones(raw.ratings.size, dtype=bool)
    m = from_pairs(raw.users[keep], raw.items[keep], MIN_USER_INTERACTIONS if explicit else 0)
    if m.nnz == 0:
        rule = f"rating ≥ {MIN_RATING:g} and users with ≥ {MIN_USER_INTERACTIONS} such interactions"
        raise DataError(f"{raw.source}: no interactions left after filtering ({rule}); expected a non-empty dataset")
    return m


def to_csr(df: pl.DataFrame, user_ids: np.ndarray, item_ids: np.ndarray) -> sp.csr_matrix:
    rows = positions(df["user"], user_ids)
    cols = positions(df["item"], item_ids)
    m = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(user_ids), len(item_ids)))
    m.sum_duplicates()
    m.sort_indices()
    return m


def user_group(df: pl.DataFrame, users: np.ndarray, item_ids: np.ndarray, with_targets: bool) -> UserGroup:
    users = np.sort(users)
    sub = df.filter(pl.col("user").is_in(pl.Series(users).implode()))
    if not with_targets:
        return UserGroup(users, to_csr(sub, users, item_ids), None)
    return UserGroup(
        users,
        to_csr(sub.filter(~pl.col("target")), users, item_ids),
        to_csr(sub.filter(pl.col("target")), users, item_ids),
    )


def _lex_sorted(rows: np.ndarray, lex_pos: np.ndarray) -> np.ndarray:
    return rows[np.argsort(lex_pos[rows], kind="stable")]


def _positions_of(order: np.ndarray, n: int) -> np.ndarray:
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(order.size)
    return pos


def _take_entries(x: sp.csr_matrix, mask: np.ndarray) -> sp.csr_matrix:
    """The entries of ``x`` where ``mask`` holds, in their order (rows and shape unchanged)."""
    rows = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))
    counts = np.bincount(rows[mask], minlength=x.shape[0])
    indptr = np.zeros(x.shape[0] + 1, dtype=x.indptr.dtype)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((x.data[mask], x.indices[mask], indptr), shape=x.shape)


def mark_targets(
    held: sp.csr_matrix, item_lex_pos: np.ndarray, rng: np.random.Generator, fraction: float = TARGET_FRACTION
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Splits each row into (inputs, targets): floor(fraction·n_u) random entries are targets.

    The random keys are drawn in (user id, item id) string order, rows being in user-id string
    order already, so the result depends only on the data and the generator's state.
    """
    rows = np.repeat(np.arange(held.shape[0]), np.diff(held.indptr))
    key = np.empty(held.nnz)
    key[np.lexsort((item_lex_pos[held.indices], rows))] = rng.random(held.nnz)
    by_key = np.lexsort((key, rows))
    del key
    rank = np.empty(held.nnz, dtype=np.int64)
    rank[by_key] = np.arange(held.nnz) - held.indptr[rows[by_key]]
    del by_key
    per_user = np.floor(np.diff(held.indptr) * fraction).astype(np.int64)
    target = rank < per_user[rows]
    return _take_entries(held, ~target), _take_entries(held, target)


def strong_split(m: RatingMatrix, test_users: int, val_users: int, seed: int, source: str) -> Split:
    """Disjoint test / validation / train users; 80/20 fold-in/targets for held-out users.

    Every group's rows are in user-id string order (numpy's sort of the ids)."""
    n_users = len(m.user_ids)
    if test_users < 1 or val_users < 0:
        raise DataError(f"need ≥ 1 test user and ≥ 0 validation users, got {test_users} and {val_users}")
    if n_users <= test_users + val_users:
        raise DataError(
            f"{source}: {n_users} users after filtering, fewer than the split needs "
            f"({test_users} test + {val_users} validation + at least 1 training user)"
        )
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_users)
    user_lex = _positions_of(np.argsort(m.user_ids, kind="stable"), n_users)
    held_n = test_users + val_users
    test_r, val_r = _lex_sorted(perm[:test_users], user_lex), _lex_sorted(perm[test_users:held_n], user_lex)
    train_r, held_r = _lex_sorted(perm[held_n:], user_lex), _lex_sorted(perm[:held_n], user_lex)
    item_lex = _positions_of(np.argsort(m.item_ids, kind="stable"), len(m.item_ids))
    inputs, targets = mark_targets(m.x[held_r], item_lex, rng)
    at = _positions_of(held_r, n_users)  # a held-out user's row in inputs / targets

    def group(rows: np.ndarray) -> UserGroup:
        return UserGroup(m.user_ids[rows], inputs[at[rows]], targets[at[rows]])

    return Split(m.item_ids, m.x[train_r], m.user_ids[train_r], group(test_r), group(val_r) if val_users else None)


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
    return Split(item_ids, to_csr(train_df, train_u, item_ids), train_u, user_group(df, test_u, item_ids, True), None)


def sample_population(split: Split, users: int, seed: int) -> UserGroup:
    """A seeded sample of training users (with their full rows) for weak generalisation."""
    n = split.train.shape[0]
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xB00C,)))
    rows = np.sort(rng.choice(n, size=min(users, n), replace=False))
    return UserGroup(split.train_user_ids[rows], split.train[rows], None)
