"""The server's belief about who sent a signal (docs/concepts/multi-selection.md, "The server's
response in d dimensions"): a public sample of training users, weighted by the likelihood of the
lattice signal (:func:`recsvc.multiselection.lattice_log_likelihood`).

The device sends z = a + discrete Laplace noise with P(x) ∝ exp(−|x|·ε/Δ) per coordinate (a: its
lattice point). Under a uniform prior over the public sample, prototype p's posterior weight is

    w_p ∝ exp(−‖z − a_p‖₁ · ε/Δ)          (a_p: p's lattice point)

computed in log space (the distances are dozens of Δ/ε at large ε). Weights below
``WEIGHT_FLOOR`` times the largest are set to 0: together they hold at most P·WEIGHT_FLOOR of the
mass, and at small ε none is ever dropped, since local ε-DP bounds every ratio w_p/w_q by e^ε.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError
from recsvc.multiselection.embedding import Floats

Ints = npt.NDArray[np.int64]

#: weights below this fraction of the largest are dropped (≈ e^−27.6)
WEIGHT_FLOOR = 1e-12


@dataclass(frozen=True)
class Population:
    """The public sample the server answers from: P training users' clipped embeddings (P × d)
    and each one's top-L unseen items (P × L, row −1 = padding) with their true SANSA scores
    (−inf = padding), best first. Items outside a user's top L are valued at the user's floor,
    the L-th score: an upper bound on any of them (see :mod:`.greedy`)."""

    embeddings: Floats
    top_index: Ints
    top_score: Floats
    num_items: int

    def __post_init__(self) -> None:
        p, d = self.embeddings.shape
        if self.top_index.shape != self.top_score.shape or self.top_index.shape[0] != p:
            raise ParamError(
                f"population shapes do not match: embeddings {self.embeddings.shape}, top_index "
                f"{self.top_index.shape}, top_score {self.top_score.shape}; expected P × d, P × L, P × L"
            )
        if p == 0 or d == 0:
            raise ParamError("the population is empty; expected at least one user and d ≥ 1")
        if not np.isfinite(self.embeddings).all():
            raise ParamError("population embeddings must be finite")
        pad = self.top_index < 0
        if (self.top_index >= self.num_items).any():
            raise ParamError(f"population top_index has rows ≥ num_items {self.num_items}")
        if not np.isfinite(self.top_score[~pad]).all() or (~np.isneginf(self.top_score[pad])).any():
            raise ParamError("population top_score must be finite exactly where top_index is not padding (−1)")
        if (~pad).sum(axis=1).min() == 0:
            raise ParamError("every population user needs at least one scored item")

    @property
    def size(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @cached_property
    def floor(self) -> Floats:
        """Each user's L-th best finite score: what any item outside the top L is valued at."""
        finite = np.where(self.top_index >= 0, self.top_score, np.inf)
        return np.asarray(finite.min(axis=1), dtype=np.float64)

    @cached_property
    def gain(self) -> Floats:
        """score − floor ≥ 0 on each top-L entry, 0 on padding."""
        g = self.top_score - self.floor[:, None]
        return np.asarray(np.where(self.top_index >= 0, g, 0.0), dtype=np.float64)

    @cached_property
    def slot(self) -> Ints:
        """top_index with padding sent to the extra item ``num_items`` (bincount's sink)."""
        return np.asarray(np.where(self.top_index >= 0, self.top_index, self.num_items), dtype=np.int64)

    @cached_property
    def by_item(self) -> tuple[Ints, Ints, Floats]:
        """The inverse lists (CSC): for item j, users[ptr[j]:ptr[j+1]] have j in their top L, with
        the gains gain[ptr[j]:ptr[j+1]]."""
        rows, cols = np.nonzero(self.top_index >= 0)
        items = self.top_index[rows, cols]
        order = np.argsort(items, kind="stable")
        ptr = np.zeros(self.num_items + 1, np.int64)
        np.cumsum(np.bincount(items, minlength=self.num_items), out=ptr[1:])
        return ptr, rows[order].astype(np.int64), self.gain[rows, cols][order]

    def warm(self) -> Population:
        """Computes the derived arrays now (a server does this at startup, not on a request)."""
        _ = self.floor, self.gain, self.slot, self.by_item
        return self


def weights_from_log_likelihood(ll: Floats) -> Floats:
    """Normalised weights (sum 1) from log-likelihoods under a uniform prior, those below
    WEIGHT_FLOOR of the largest set to 0."""
    rel = ll - ll.max()
    w = np.where(rel >= np.log(WEIGHT_FLOOR), np.exp(rel), 0.0)
    return np.asarray(w / w.sum(), dtype=np.float64)
