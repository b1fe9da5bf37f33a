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

**The population.** The server weights a public population by a signal's likelihood. It holds no
user's own row: a seeded sample of training users is cut into groups of at least ``group`` users
with near embeddings (MDAV microaggregation, :func:`mdav_groups`), and each group becomes one
prototype: the mean of its members' clipped embeddings (inside the L1 ball, which is convex) and
the top-L items of its members' mean unseen SANSA scores. A member values an item it has seen like
its worst unseen item, since its device never picks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import svds

from recsvc.checks import ParamError
from recsvc.model import Model, top_k
from recsvc.multiselection import clip_l1
from recsvc.policy import sample_users

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
    return sample_users(total, users, seed, SAMPLE_STREAM)


def mdav_groups(z: np.ndarray, group: int) -> np.ndarray:
    """MDAV microaggregation of the rows of ``z`` (L1 distance): a group label per row, every group
    of ``group`` to 2·``group`` − 1 rows (one group if there are fewer than 2·``group``). Each step
    takes the row farthest from the remaining rows' mean and the row farthest from it, and groups
    each with its ``group`` − 1 nearest; ties go to the lower row, so the labels are reproducible."""
    labels = np.full(z.shape[0], -1, np.int64)
    remaining = np.arange(z.shape[0])
    nxt = 0

    def take(anchor: np.ndarray) -> None:
        nonlocal remaining, nxt
        d = np.abs(z[remaining] - anchor).sum(axis=1)
        members = remaining[np.argsort(d, kind="stable")[:group]]
        labels[members] = nxt
        nxt += 1
        remaining = np.setdiff1d(remaining, members, assume_unique=True)

    def farthest(anchor: np.ndarray) -> np.ndarray:
        d = np.abs(z[remaining] - anchor).sum(axis=1)
        return np.asarray(z[remaining[int(np.argmax(d))]])

    while remaining.size >= 3 * group:
        r = farthest(z[remaining].mean(axis=0))
        s_ = farthest(r)
        take(r)
        take(s_)
    if remaining.size >= 2 * group:
        take(farthest(z[remaining].mean(axis=0)))
    labels[remaining] = nxt
    return labels


@dataclass(frozen=True)
class Prototypes:
    """The server's public population (``multiselect/`` in the artifact): one row per group of
    training users, never one per user."""

    user_rows: np.ndarray  # the sampled training rows that were grouped, ascending
    labels: np.ndarray  # each sampled row's group
    embeddings: np.ndarray  # (P, d): each group's mean clipped embedding
    top_index: np.ndarray  # (P, L) int32, −1 padding
    top_score: np.ndarray  # (P, L) the group's mean unseen SANSA scores, −inf padding


def population_prototypes(
    train: sp.spmatrix,
    embeddings: np.ndarray,
    radius: float,
    model: Model,
    users: int,
    group: int,
    top: int,
    seed: int,
) -> Prototypes:
    """≤ ``users`` sampled training users (seeded; those with an unseen item) aggregated into
    prototypes of ≥ ``group`` members each, with their ``top`` best items by mean unseen score."""
    x = sp.csr_matrix(train)
    x.data[:] = 1.0
    has_unseen = np.diff(x.indptr) < x.shape[1]
    eligible = np.flatnonzero(has_unseen)
    if eligible.size < group:
        raise ParamError(
            "{multiselect_group} {group} is more than the {n} training users with an unseen item; "
            "expected a group size they can fill",
            group=group,
            n=int(eligible.size),
        )
    rows = eligible[sample_rows(eligible.size, users, seed)]
    clipped = clip_l1(embeddings[rows], radius)
    labels = mdav_groups(clipped, group)
    count = int(labels.max()) + 1
    keep = min(top, x.shape[1])
    index = np.empty((count, keep), np.int32)
    score = np.empty((count, keep))
    means = np.empty((count, clipped.shape[1]))
    for g in range(count):
        members = np.flatnonzero(labels == g)
        means[g] = clipped[members].mean(axis=0)
        scores = model.score_unseen(x[rows[members]])
        worst = np.where(np.isfinite(scores), scores, np.inf).min(axis=1, keepdims=True)
        value = np.where(np.isfinite(scores), scores, worst).mean(axis=0, keepdims=True)
        t = top_k(value, keep)
        index[g], score[g] = t.index[0], t.score[0]
    return Prototypes(rows, labels, means, index, score)
