"""All kept interactions as one binary users × items CSR matrix in canonical id order, built
straight from integer arrays (docs/guides/offline-pipeline.md#memory).

This is what `recsvc prep` splits. At Netflix scale (100 M interactions) it costs 8 bytes per
interaction (int32 column indices and float32 ones), where a table of string ids cost ~160: ids
become row and column numbers once, duplicates go by sorting one int64 key per interaction, and
no per-interaction string or Python object is made.

The filters are :func:`data_prep.split.filter_implicit`'s (set semantics, then users with ≥
``min_per_user`` interactions); ids are ordered as :func:`canonical_order` orders
them (numerically when all are integers, else lexicographically).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import scipy.sparse as sp

# A dense id → row table is used when the largest id is at most this many times the row count
# (plus a constant): one int32 per possible id instead of sorting every interaction's id.
_DENSE_ID_SPREAD = 8
_DENSE_ID_SLACK = 1 << 20


@dataclass(frozen=True)
class RatingMatrix:
    user_ids: np.ndarray  # str, the rows' ids in canonical order
    item_ids: np.ndarray  # str, the columns' ids in canonical order
    x: sp.csr_matrix  # binary float32; sorted int32 column indices

    @property
    def nnz(self) -> int:
        return int(self.x.nnz)


def canonical_order(ids: pl.Series) -> np.ndarray:
    """Unique ids sorted numerically when all are integers, else lexicographically."""
    uniq = ids.unique()
    as_int = uniq.cast(pl.Int64, strict=False)
    if as_int.null_count() == 0:
        return uniq.gather(as_int.arg_sort()).to_numpy().astype(str)
    return uniq.sort().to_numpy().astype(str)


def positions(values: pl.Series, ids: np.ndarray) -> np.ndarray:
    """Each value's position in ``ids`` (int64)."""
    lookup = pl.DataFrame({"_id": ids, "_ix": np.arange(len(ids), dtype=np.int64)})
    out = pl.DataFrame({"_id": values}).join(lookup, on="_id", how="left", maintain_order="left")["_ix"]
    return out.to_numpy()


def csr_from_keys(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """The binary matrix with a 1 at every (row, col) given, duplicates once; rows/cols are consumed."""
    n_items = shape[1]
    key = rows.astype(np.int64)
    key *= n_items
    key += cols
    del rows, cols
    key.sort()
    if key.size:
        keep = np.empty(key.size, dtype=bool)
        keep[0] = True
        np.not_equal(key[1:], key[:-1], out=keep[1:])
        key = key[keep]
        del keep
    row = key // n_items
    counts = np.bincount(row, minlength=shape[0])
    col = (key - row * n_items).astype(np.int32)
    del key, row
    index = np.int32 if col.size < 2**31 else np.int64
    indptr = np.zeros(shape[0] + 1, dtype=index)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((np.ones(col.size, np.float32), col.astype(index, copy=False), indptr), shape=shape)


def compact(x: sp.csr_matrix, row_ids: np.ndarray, col_ids: np.ndarray, min_per_row: int) -> RatingMatrix:
    """Drops rows with fewer than ``min_per_row`` entries, then the columns left empty."""
    keep_rows = np.diff(x.indptr) >= min_per_row
    if not keep_rows.all():
        x = x[np.flatnonzero(keep_rows)]
        row_ids = row_ids[keep_rows]
    used = np.bincount(x.indices, minlength=x.shape[1]) > 0
    if not used.all():
        new_col = np.cumsum(used, dtype=np.int64) - 1
        x = sp.csr_matrix(
            (x.data, new_col[x.indices].astype(x.indices.dtype), x.indptr), shape=(x.shape[0], int(used.sum()))
        )
        col_ids = col_ids[used]
    return RatingMatrix(np.asarray(row_ids).astype(str), np.asarray(col_ids).astype(str), x)


def _dense_codes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct ids, each id's position among them) for integer ids."""
    if ids.size and ids.min() >= 0 and ids.max() <= _DENSE_ID_SPREAD * ids.size + _DENSE_ID_SLACK:
        present = np.zeros(int(ids.max()) + 1, dtype=bool)
        present[ids] = True
        distinct = np.flatnonzero(present)
        lookup = np.cumsum(present, dtype=np.int64) - 1
        del present
        return distinct, lookup.astype(np.int32)[ids]
    distinct, codes = np.unique(ids, return_inverse=True)
    return distinct, codes.astype(np.int32)


def from_pairs(users: np.ndarray, items: np.ndarray, min_per_user: int) -> RatingMatrix:
    """Integer-id pairs (duplicates allowed) → the filtered, compacted matrix."""
    user_ids, rows = _dense_codes(np.asarray(users))
    item_ids, cols = _dense_codes(np.asarray(items))
    x = csr_from_keys(rows, cols, (len(user_ids), len(item_ids)))
    return compact(x, user_ids, item_ids, min_per_user)


def from_frame(df: pl.DataFrame, min_per_user: int) -> RatingMatrix:
    """A table with string ``user`` and ``item`` columns (any ids) → the filtered, compacted matrix."""
    user_ids, item_ids = canonical_order(df["user"]), canonical_order(df["item"])
    rows, cols = positions(df["user"], user_ids), positions(df["item"], item_ids)
    x = csr_from_keys(rows, cols, (len(user_ids), len(item_ids)))
    return compact(x, user_ids, item_ids, min_per_user)
