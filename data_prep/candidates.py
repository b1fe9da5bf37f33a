"""Chunked scoring of users with the SANSA model (run through :mod:`recsvc.engines`).

Scores are dense ``x @ W1 @ W2`` (``Model.score``), exact zeros included; seen items are
masked to −inf. Ranking is by score descending, ties broken by the lower item column, so the
result is deterministic and independent of chunking and of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from recsvc.artifacts import Model

N_CANDIDATES = 500


@dataclass(frozen=True)
class ScoringContext:
    """Read-only data shipped once per worker: the model and the users' input rows."""

    model: Model
    inputs: sp.csr_matrix
    k: int = N_CANDIDATES


@dataclass(frozen=True)
class TopK:
    """Each user's ranked unseen items: columns (−1 = padding) and raw scores (−inf = padding)."""

    index: np.ndarray  # (B, k) int32
    score: np.ndarray  # (B, k) float64

    @property
    def count(self) -> np.ndarray:
        return (self.index >= 0).sum(axis=1)

    @staticmethod
    def concat(parts: list[TopK]) -> TopK:
        return TopK(np.concatenate([p.index for p in parts]), np.concatenate([p.score for p in parts]))


def masked_scores(rows: range, ctx: ScoringContext) -> np.ndarray:
    """Dense scores of users ``rows`` with their input items set to −inf."""
    x = ctx.inputs[rows.start : rows.stop]
    scores = ctx.model.score(x)
    r = np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))
    scores[r, x.indices] = -np.inf
    return scores


def top_k(scores: np.ndarray, k: int) -> TopK:
    """Top-k per row of ``scores`` (−inf = excluded), ties → lower column first. O(n) per row."""
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
    pad = ~np.isfinite(vals)  # −inf: a seen item filled the slot, i.e. fewer than k unseen items
    cols[pad] = -1
    return TopK(cols, vals)


def score_top_k(rows: range, ctx: ScoringContext) -> TopK:
    """Engine work unit for the test users: their top-k unseen items."""
    return top_k(masked_scores(rows, ctx), ctx.k)


def score_population(rows: range, ctx: ScoringContext) -> tuple[np.ndarray, TopK]:
    """Engine work unit for the sensitivity population: dense scores (NaN = the user's own
    input items, excluded from the percentiles) and their top-k unseen items."""
    scores = masked_scores(rows, ctx)
    top = top_k(scores, ctx.k)
    scores[np.isneginf(scores)] = np.nan
    return scores, top
