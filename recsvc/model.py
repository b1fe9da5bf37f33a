"""SANSA scoring and the one top-k ranking, shared by the offline pipeline and the service.

Scores are dense ``x @ W1 @ W2`` (:meth:`Model.score`), exact zeros included; a user's own
input items are masked to −inf (:meth:`Model.score_unseen`). :func:`top_k` ranks by score
descending and breaks ties by the lower item column, so a ranking is deterministic and the
same whether it is computed in a pipeline chunk or for one service request.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numba
import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Model:
    """SANSA's two sparse factors; scores for a user row x are x @ W1 @ W2."""

    w1: sp.csr_matrix
    w2: sp.csr_matrix
    item_ids: np.ndarray  # str, column order of W1/W2

    @cached_property
    def index(self) -> dict[str, int]:
        return {item: i for i, item in enumerate(self.item_ids.tolist())}

    def score(self, x: sp.csr_matrix) -> np.ndarray:
        """Dense scores (users × items); seen items are not masked (see :meth:`score_unseen`)."""
        return np.asarray((x @ self.w1 @ self.w2).todense(), dtype=np.float64)

    def score_one(self, cols: np.ndarray) -> np.ndarray:
        """Dense float64 scores (items,) of ONE user whose input items are the model columns
        ``cols`` (distinct), seen items not masked: :meth:`score` of that binary row, up to
        summation order (≈ 1e-16). A compiled pass over the factors' nonzeros, several times
        faster than scipy's sparse product for one user (the service scores one per request)."""
        return _score_one(np.asarray(cols, np.int64), _arrays(self.w1), _arrays(self.w2), self.w2.shape[1])

    @cached_property
    def w2_columns(self) -> sp.csc_matrix:
        """W2 by columns: one item's score reads only that item's column."""
        return sp.csc_matrix(self.w2)

    def score_items(self, cols: np.ndarray, items: np.ndarray) -> np.ndarray:
        """:meth:`score_one` of the user with input columns ``cols`` at ``items`` only, up to
        summation order: a device re-ranking k items reads k columns of W2 instead of all of it."""
        cols, items = np.asarray(cols, np.int64), np.asarray(items, np.int64)
        return _score_items(cols, items, _arrays(self.w1), _arrays(self.w2_columns), self.w1.shape[1])

    def score_unseen(self, x: sp.csr_matrix) -> np.ndarray:
        """Dense scores with each user's input items (the nonzeros of its row of ``x``) at −inf."""
        scores = self.score(x)
        rows = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))
        scores[rows, x.indices] = -np.inf
        return scores


# A compressed sparse matrix as its (indptr, indices, data) arrays, which the kernels read.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def _arrays(m: sp.csr_matrix | sp.csc_matrix) -> Arrays:
    return m.indptr, m.indices, m.data


@numba.njit(cache=True, nogil=True)
def _hidden(cols: np.ndarray, w1: Arrays, r: int) -> np.ndarray:  # pragma: no cover - numba
    p1, i1, d1 = w1
    u = np.zeros(r)  # x @ W1: the sum of the input items' rows of W1
    for c in cols:
        for k in range(p1[c], p1[c + 1]):
            u[i1[k]] += d1[k]
    return u


@numba.njit(cache=True, nogil=True)
def _score_items(
    cols: np.ndarray, items: np.ndarray, w1: Arrays, w2c: Arrays, r: int
) -> np.ndarray:  # pragma: no cover - numba
    u = _hidden(cols, w1, r)
    p2c, i2c, d2c = w2c
    y = np.zeros(items.shape[0])
    for j in range(items.shape[0]):  # (x W1) · column of W2
        c = items[j]
        for k in range(p2c[c], p2c[c + 1]):
            y[j] += u[i2c[k]] * d2c[k]
    return y


@numba.njit(cache=True, nogil=True)
def _score_one(cols: np.ndarray, w1: Arrays, w2: Arrays, n: int) -> np.ndarray:  # pragma: no cover - numba
    p2, i2, d2 = w2
    u = _hidden(cols, w1, p2.shape[0] - 1)
    y = np.zeros(n)  # u @ W2: scatter each nonzero u_i times row i of W2
    for i in range(u.shape[0]):
        ui = u[i]
        if ui != 0.0:
            for k in range(p2[i], p2[i + 1]):
                y[i2[k]] += ui * d2[k]
    return y


@dataclass(frozen=True)
class TopK:
    """Each user's ranked items: columns (−1 = padding) and raw scores (−inf = padding)."""

    index: np.ndarray  # (B, k) int32
    score: np.ndarray  # (B, k) float64

    @property
    def count(self) -> np.ndarray:
        return (self.index >= 0).sum(axis=1)

    @staticmethod
    def concat(parts: list[TopK]) -> TopK:
        return TopK(np.concatenate([p.index for p in parts]), np.concatenate([p.score for p in parts]))


def top_k(scores: np.ndarray, k: int) -> TopK:
    """Top-k per row of ``scores`` (−inf = excluded), ties → lower column first. O(n) per row.

    A row with fewer than k finite scores is padded at its end (column −1, score −inf)."""
    b, n = scores.shape
    k = min(k, n)
    if b == 0 or k == 0:
        return TopK(np.zeros((b, k), np.int32), np.zeros((b, k)))
    kth = np.partition(scores, n - k, axis=1)[:, n - k : n - k + 1]
    above = scores > kth
    tied = scores == kth
    # Take every score above the k-th value, then the lowest-column ties until k are chosen.
    need = k - above.sum(axis=1, keepdims=True)
    chosen = above | (tied & (np.cumsum(tied, axis=1) <= need))
    cols = np.nonzero(chosen)[1].reshape(b, k)  # ascending column order within each row
    vals = np.take_along_axis(scores, cols, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    cols = np.take_along_axis(cols, order, axis=1).astype(np.int32)
    vals = np.take_along_axis(vals, order, axis=1)
    pad = ~np.isfinite(vals)  # −inf: an excluded item filled the slot, i.e. fewer than k eligible
    cols[pad] = -1
    return TopK(cols, vals)
