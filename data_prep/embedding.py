"""Multi-selection's public embedding and the server's population sample, from the TRAINING users
only (docs/reference/client-bundle.md, docs/concepts/multi-selection.md).

**The embedding.** X̂ is the training interaction matrix with each row scaled to unit L2 norm
(a binary row of |h| items divided by √|h|). Its truncated SVD X̂ ≈ U Σ Vᵀ of rank d gives the
item factors E = V (n × d, orthonormal columns): a history h then embeds as
e(h) = Σ_{i∈h} E[i]/√|h| = x̂ V, the projection of its normalised row onto the top d directions
(:func:`recsvc.multiselection.embed`), and E·e is PureSVD's score. Each column's sign is fixed
(its largest-magnitude entry positive) so the same data gives the same bytes.

**The radius.** R is the median L1 norm of the training users' embeddings (:data:`RADIUS_RULE`):
half of them are clipped by at most a scaling, and the noise 2R/ε is not set by the few users
with the largest norms.

**The population sample.** A seeded sample of training users: their clipped embeddings and their
top-L unseen items by SANSA score, which the server weights by a signal's likelihood.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import svds

from recsvc.checks import ParamError
from recsvc.model import Model, top_k
from recsvc.multiselection import clip_l1

RADIUS_RULE = "median L1 norm of the training users' embeddings"
SAMPLE_STREAM = 2**32 + 25  # spawn key of the population sample's seed stream (apart from the policy's)


def normalised_rows(x: sp.spmatrix) -> sp.csr_matrix:
    """Each row of the binary matrix ``x`` (its nonzeros as 1) divided by √(its count); empty rows stay 0."""
    b = sp.csr_matrix(x, dtype=np.float64, copy=True)
    b.data[:] = 1.0
    b.sum_duplicates()
    b.data[:] = 1.0
    counts = np.diff(b.indptr)
    b.data /= np.repeat(np.sqrt(np.maximum(counts, 1)), counts)
    return b


def fit_embedding(train: sp.spmatrix, dim: int, seed: int) -> np.ndarray:
    """E (n × dim): the top-``dim`` right singular vectors of the row-normalised training matrix,
    by decreasing singular value, each with its largest-magnitude entry positive."""
    x = normalised_rows(train)
    if not 1 <= dim < min(x.shape):
        raise ParamError(
            "{embedding_dim} {dim} must be below min(training users, items) = {most}; expected 1 ≤ d < {most}",
            dim=dim,
            most=min(x.shape),
        )
    v0 = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SAMPLE_STREAM + 1,))).uniform(
        -1, 1, min(x.shape)
    )
    _, s, vt = svds(x, k=dim, v0=v0, solver="arpack", random_state=seed)
    factors = vt[np.argsort(-s, kind="stable")].T
    peak = factors[np.argmax(np.abs(factors), axis=0), np.arange(dim)]
    return np.ascontiguousarray(factors * np.where(peak < 0, -1.0, 1.0), dtype=np.float64)


def user_embeddings(x: sp.spmatrix, factors: np.ndarray) -> np.ndarray:
    """Each row's unclipped embedding e(h) (:func:`recsvc.multiselection.embed`), all at once."""
    return np.asarray(normalised_rows(x) @ factors, dtype=np.float64)


def choose_radius(embeddings: np.ndarray) -> float:
    """R by :data:`RADIUS_RULE`, over the users with a nonzero embedding."""
    norms = np.abs(embeddings).sum(axis=1)
    norms = norms[norms > 0]
    if norms.size == 0:
        raise ParamError("no training user has a nonzero embedding; expected training interactions")
    return float(np.median(norms))


def sample_rows(total: int, users: int, seed: int) -> np.ndarray:
    """The population sample's training rows: ``users`` of ``total`` (seeded; all if fewer), ascending."""
    if total <= users:
        return np.arange(total)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SAMPLE_STREAM,)))
    return np.sort(rng.choice(total, users, replace=False))


@dataclass(frozen=True)
class PopulationSample:
    """The server's public population (``multiselect/`` in the artifact)."""

    user_rows: np.ndarray  # rows of the training matrix sampled, ascending
    embeddings: np.ndarray  # (P, d) clipped to R
    top_index: np.ndarray  # (P, L) int32, −1 padding
    top_score: np.ndarray  # (P, L) raw SANSA scores of unseen items, −inf padding


def population_sample(
    train: sp.spmatrix,
    embeddings: np.ndarray,
    radius: float,
    model: Model,
    users: int,
    top: int,
    seed: int,
    chunk: int = 256,
) -> PopulationSample:
    """≤ ``users`` training users with an unseen item (seeded; all if fewer), their clipped
    embeddings and their ``top`` best unseen items by SANSA score (scored ``chunk`` users at a time)."""
    x = sp.csr_matrix(train)
    eligible = np.flatnonzero(np.diff(x.indptr) < x.shape[1])  # a user who has seen every item has none to offer
    rows = eligible[sample_rows(eligible.size, users, seed)]
    index = np.empty((rows.size, min(top, x.shape[1])), np.int32)
    score = np.empty(index.shape)
    for start in range(0, rows.size, chunk):
        part = rows[start : start + chunk]
        t = top_k(model.score_unseen(x[part]), top)
        index[start : start + part.size], score[start : start + part.size] = t.index, t.score
    return PopulationSample(rows, clip_l1(embeddings[rows], radius), index, score)
