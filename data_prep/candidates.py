"""Chunked scoring of users with the SANSA model: the engine work units (run through
:mod:`recsvc.engines`). Scoring, masking and the top-k tie rule are :mod:`recsvc.model`'s, so
the result is deterministic, independent of chunking and of the engine, and ranked as the
service ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from recsvc.model import Model, TopK, top_k

N_CANDIDATES = 500


@dataclass(frozen=True)
class ScoringContext:
    """Read-only data shipped once per worker: the model and the users' input rows."""

    model: Model
    inputs: sp.csr_matrix
    k: int = N_CANDIDATES


def _unseen_scores(rows: range, ctx: ScoringContext) -> np.ndarray:
    """Dense scores of users ``rows`` with their input items set to −inf."""
    return ctx.model.score_unseen(ctx.inputs[rows.start : rows.stop])


def score_top_k(rows: range, ctx: ScoringContext) -> TopK:
    """Engine work unit for the test users: their top-k unseen items."""
    return top_k(_unseen_scores(rows, ctx), ctx.k)


def score_population(rows: range, ctx: ScoringContext) -> tuple[np.ndarray, TopK]:
    """Engine work unit for the sensitivity population: dense scores (NaN = the user's own
    input items, excluded from the percentiles) and their top-k unseen items."""
    scores = _unseen_scores(rows, ctx)
    top = top_k(scores, ctx.k)
    scores[np.isneginf(scores)] = np.nan
    return scores, top
