"""Top-k accuracy metrics as in SANSA's evaluation code (docs/reference/specification.md §4).

Recall@k = hits / min(k, |targets|);  nDCG@k = DCG / ideal DCG with ideal length min(k, |targets|).
The weak-generalisation protocol (Amazon-book, as in LightGCN/BARS) reports instead
Recall@20 = hits / |targets| (glami/sansa's ``recall_BARS``) and nDCG@20, so both are kept.
Users without targets are skipped (they have no defined recall).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def hit_matrix(top: np.ndarray, targets: sp.csr_matrix) -> np.ndarray:
    """hits[b, j] = True iff item ``top[b, j]`` is a target of user b (−1 = padding, never a hit)."""
    n_items = targets.shape[1]
    rows = np.repeat(np.arange(targets.shape[0], dtype=np.int64), np.diff(targets.indptr))
    target_keys = rows * n_items + targets.indices
    keys = np.arange(top.shape[0], dtype=np.int64)[:, None] * n_items + top
    return np.isin(keys, target_keys) & (top >= 0)


def recall_at(hits: np.ndarray, n_targets: np.ndarray, k: int) -> np.ndarray:
    return hits[:, :k].sum(axis=1) / np.minimum(k, n_targets)


def bars_recall_at(hits: np.ndarray, n_targets: np.ndarray, k: int) -> np.ndarray:
    """hits / |targets| (not capped at k): the BARS / LightGCN recall."""
    return hits[:, :k].sum(axis=1) / n_targets


def ndcg_at(hits: np.ndarray, n_targets: np.ndarray, k: int) -> np.ndarray:
    k_eff = min(k, hits.shape[1])
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = (hits[:, :k_eff] * discount[:k_eff]).sum(axis=1)
    ideal = np.cumsum(discount)[np.minimum(k, n_targets) - 1]
    return dcg / ideal


def accuracy(top: np.ndarray, targets: sp.csr_matrix) -> dict[str, float]:
    """Mean Recall@20, Recall@50, nDCG@100 (strong generalisation), BARS Recall@20 and nDCG@20
    (weak generalisation) over users with ≥ 1 target.

    ``top`` holds each user's ranked recommendations (item columns, −1 padded), ≥ 100 wide
    unless the catalogue is smaller.
    """
    n_targets = np.diff(targets.indptr)
    keep = n_targets > 0
    if not keep.any():
        raise ValueError("accuracy: no user has a target item; expected held-out users with targets")
    hits = hit_matrix(top, targets)[keep]
    n_targets = n_targets[keep]
    return {
        "recall@20": float(recall_at(hits, n_targets, 20).mean()),
        "recall@50": float(recall_at(hits, n_targets, 50).mean()),
        "ndcg@100": float(ndcg_at(hits, n_targets, 100).mean()),
        "bars_recall@20": float(bars_recall_at(hits, n_targets, 20).mean()),
        "ndcg@20": float(ndcg_at(hits, n_targets, 20).mean()),
        "users": int(keep.sum()),
    }
