"""SIS, Kifer et al.'s two-stage support counts, and the private top k they feed.

Sensitivities, for the neighbouring relation the caller names (``add-remove`` a row, or
``replace`` one), on data whose entries lie in [−1, 1] (:func:`eval.feature_selection.data.max_abs`):

* SIS's score of feature j is |x_jᵀy| = |Σ_i x_ij y_i|. A row contributes x_ij·y_i ∈ [−1, 1], so
  adding or removing one moves the sum by at most 1, and replacing one by at most 2; |·| is
  1-Lipschitz, so Δ = 1 (add-remove) or 2 (replace), for every feature at once.
* Two-stage's score of feature j is the number of blocks whose Lasso support holds j. The blocks
  are a data-independent partition of the rows (a fixed number B of them, public), so a row
  added, removed or replaced changes one block, whose support may change arbitrarily: every
  count moves by at most 1, under either relation. Δ = 1.

Both top-k steps call :func:`recsvc.mechanisms.select_slate` (``clm`` by default: ε-DP when every
score moves by at most Δ in either direction, the case here), so their privacy is the audited
mechanism's. The non-private top k breaks ties uniformly at random: two-stage's integer counts tie
often, and breaking them by index would favour the low indices that hold Figure 1's informative
features.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms import select_slate

NEIGHBOURING = ("add-remove", "replace")
SIS_SENSITIVITY = {"add-remove": 1.0, "replace": 2.0}
COUNT_SENSITIVITY = {"add-remove": 1.0, "replace": 1.0}
DEFAULT_LASSO_ALPHA = 0.1  # the seed's λ, in scikit-learn's scale (1/(2N) on the squared loss)


def sis_scores(x: np.ndarray, y: np.ndarray) -> npt.NDArray[np.float64]:
    """|x_jᵀy| for every feature j (x: (N, d), y: (N,))."""
    return np.abs(x.T @ y)


def sis_bound(n_rows: int) -> float:
    """The largest SIS score on data in [−1, 1]: each score lies in [0, N]."""
    return float(n_rows)


def block_count(n_rows: int) -> int:
    """⌊√N⌋ blocks (of about √N rows each; the seed's §2.2). At least 1."""
    return max(1, math.isqrt(n_rows))


def blocks(n_rows: int, rng: np.random.Generator | None = None) -> list[npt.NDArray[np.intp]]:
    """The rows of each of the ⌊√N⌋ disjoint blocks: consecutive rows, in the order of a uniform
    permutation drawn from ``rng`` (randomness that never looks at the data), or in the given
    order without one (Figure 1: so each block gets one W2 outlier, as the seed designs)."""
    order = np.arange(n_rows) if rng is None else rng.permutation(n_rows)
    return list(np.array_split(order, block_count(n_rows)))


def lasso_coef(x: np.ndarray, y: np.ndarray, alpha: float) -> npt.NDArray[np.float64]:
    """The Lasso's coefficients, min (1/2N)·‖y − b − Xw‖² + alpha·‖w‖₁ (scikit-learn's scale, with
    an intercept b), solved exactly by LARS (scikit-learn's LassoLars): the same solution as its
    coordinate-descent ``Lasso`` run to convergence (tests/eval checks the supports agree), several
    times faster on a block of fewer rows than features, and with no tolerance to tune."""
    from sklearn.linear_model import LassoLars

    with warnings.catch_warnings():
        # LARS warns when a block's rows are nearly collinear; its answer is still the solution
        warnings.simplefilter("ignore")
        return np.asarray(LassoLars(alpha=alpha).fit(x, y).coef_, dtype=np.float64)


def support_counts(
    x: np.ndarray, y: np.ndarray, parts: list[npt.NDArray[np.intp]], alpha: float
) -> npt.NDArray[np.float64]:
    """Two-stage's scores: for each feature, in how many blocks' Lasso supports it is."""
    counts = np.zeros(x.shape[1])
    for rows in parts:
        counts += lasso_coef(x[rows], y[rows], alpha) != 0.0
    return counts


def lasso_reference(x: np.ndarray, y: np.ndarray, k: int, alpha: float) -> npt.NDArray[np.intp]:
    """The non-private reference set: the features of the k largest |coefficients| of the Lasso
    on all rows, only among the non-zero ones (fewer than k if the fit keeps fewer)."""
    coef = np.abs(lasso_coef(x, y, alpha))
    order = np.argsort(-coef, kind="stable")[:k]
    return np.sort(order[coef[order] > 0.0])


def top_k(scores: np.ndarray, k: int, rng: np.random.Generator) -> npt.NDArray[np.intp]:
    """The non-private top k (ties broken uniformly at random), sorted by index."""
    order = np.lexsort(np.stack([rng.random(scores.shape[0]), -scores]))
    return np.sort(order[:k])


def private_top_k(
    scores: np.ndarray,
    upper: float,
    sensitivity: float,
    epsilon: float,
    k: int,
    rng: np.random.Generator,
    mechanism: str = "clm",
    params: Mapping[str, object] | None = None,
) -> npt.NDArray[np.int64]:
    """k features by ``mechanism``'s slate at ε, scores clipped to their range [0, upper] first
    (they lie there by construction; the clip makes it a checked fact), every Δ = ``sensitivity``.
    Sorted by index: the set is the answer (clm's order is uniform and carries nothing)."""
    q = np.clip(scores, 0.0, upper)
    delta = np.full(q.shape[0], sensitivity)
    given: dict[str, Any] = {name: v for name, v in (params or {}).items() if v is not None}
    return np.sort(select_slate(mechanism, q, delta, epsilon, k, rng, **given))
