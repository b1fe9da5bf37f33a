"""The server's k items for a signal: greedy maximisation of the expected best utility, and the
plain baseline (docs/concepts/multi-selection.md, "The server's response in d dimensions").

Given posterior weights w over the public population and each user's true scores s_{p,j}, the
server picks k distinct items S maximising

    F(S) = Σ_p w_p · max_{j ∈ S} s_{p,j}

(the expected score of the item the device will keep, if the sender were drawn from the
posterior). F is monotone submodular (a facility-location function), so the greedy choice is
within 1 − 1/e of the best k-subset.

**The sparse approximation.** A user's scores are kept only on their top L items; every other
item is valued at the user's floor f_p, the L-th score, which bounds it from above. Writing
g_{p,j} = s_{p,j} − f_p ≥ 0 on the top L (0 elsewhere),

    F_L(S) = Σ_p w_p f_p + Σ_p w_p · max(0, max_{j ∈ S} g_{p,j}).

F_L equals F for every user whose top L meets S and overestimates only the users it misses, by
at most f_p − max_S s_{p,j}. With L = n it IS F, and :func:`greedy` then picks exactly what
:func:`dense_greedy` picks. Greedy on F_L keeps a marginal gain per item and, after each pick,
updates it only for the users who have the picked item in their top L: O(P·L) to start, then
O(L × those users) per step, instead of O(P·n) per step.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError
from recsvc.multiselection.embedding import Floats
from recsvc.multiselection.posterior import Ints, Population, posterior_weights

#: a marginal gain this small (relative to the best single item's) counts as none: the picks left
#: then follow the items' expected scores, not the rounding left in the incremental sums.
_TIE = 1e-12


def _check_k(k: int, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ParamError(f"k must be an integer in 1..{n} (distinct items of the catalog); got {k!r}")
    return int(k)


def greedy(population: Population, weights: Floats, k: int) -> Ints:
    """k distinct item rows, in the order picked (best marginal gain first; ties → lower row),
    maximising F_L (module docstring) for the population's posterior ``weights``. Once no item
    adds anything (k beyond what the posterior's users can use), the rest are the items with the
    highest expected score Σ_p w_p s_{p,j}."""
    n = population.num_items
    k = _check_k(k, n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (population.size,):
        raise ParamError(f"weights has shape {w.shape}; expected ({population.size},)")
    gain, slot = population.gain, population.slot
    ptr, users_of, gain_of = population.by_item
    live = np.flatnonzero(w > 0)  # users with no weight change nothing
    marginal = np.bincount(slot[live].ravel(), weights=(w[live, None] * gain[live]).ravel(), minlength=n + 1)[:n]
    alone = marginal.copy()  # each item's expected gain on its own: the order once nothing gains
    tol = _TIE * max(float(alone.max()), np.finfo(np.float64).tiny)
    best = np.zeros(population.size)  # each user's best gain over the items picked so far
    picked = np.empty(k, np.int64)
    for step in range(k):
        j = int(np.argmax(marginal))
        if marginal[j] <= tol:
            j = int(np.argmax(alone))
        picked[step] = j
        marginal[j] = alone[j] = -np.inf
        lo, hi = ptr[j], ptr[j + 1]
        if lo == hi:
            continue
        users, g = users_of[lo:hi], gain_of[lo:hi]
        up = (g > best[users]) & (w[users] > 0)
        users, g = users[up], g[up]
        if users.size == 0:
            continue
        old, new = best[users], g
        rows = gain[users]
        # Each of these users' items loses the part of its gain that j now covers.
        lost = w[users, None] * (np.maximum(rows - old[:, None], 0.0) - np.maximum(rows - new[:, None], 0.0))
        marginal -= np.bincount(slot[users].ravel(), weights=lost.ravel(), minlength=n + 1)[:n]
        best[users] = new
    return picked


def dense_greedy(scores: Floats, weights: Floats, k: int) -> Ints:
    """The exact greedy on F with dense scores (P × n): the reference :func:`greedy` is tested
    against. Ties → lower row."""
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    k = _check_k(k, s.shape[1])
    alone = w @ s
    tol = _TIE * max(float(np.max(alone - w @ s.min(axis=1))), np.finfo(np.float64).tiny)
    best = np.full(s.shape[0], -np.inf)
    picked: list[int] = []
    for _ in range(k):
        value = (w[:, None] * np.maximum(s, best[:, None])).sum(axis=0)
        value[picked] = -np.inf
        j = int(np.argmax(value))
        if picked and value[j] - float(w @ best) <= tol:
            alone[picked] = -np.inf
            j = int(np.argmax(alone))
        picked.append(j)
        best = np.maximum(best, s[:, j])
    return np.asarray(picked, dtype=np.int64)


def expected_utility(scores: Floats, weights: Floats, items: npt.ArrayLike) -> float:
    """F(S) = Σ_p w_p max_{j ∈ S} s_{p,j} with dense scores (P × n)."""
    s = np.asarray(scores, dtype=np.float64)[:, np.asarray(items, dtype=np.int64)]
    return float(np.dot(np.asarray(weights, dtype=np.float64), s.max(axis=1)))


def baseline(signal: npt.ArrayLike, factors: Floats, k: int) -> Ints:
    """The plain response: the k items with the highest E·s (PureSVD's scores of the signal taken
    as the embedding), best first."""
    s = np.asarray(signal, dtype=np.float64)
    if s.shape != (factors.shape[1],):
        raise ParamError(f"signal has shape {s.shape}; expected ({factors.shape[1]},)")
    k = _check_k(k, factors.shape[0])
    score = factors @ s
    top = np.argpartition(-score, k - 1)[:k] if k < score.size else np.arange(score.size)
    order = np.lexsort((top, -score[top]))
    return np.asarray(top[order], dtype=np.int64)


def respond(population: Population, signal: npt.ArrayLike, epsilon: float, radius: float, k: int) -> Ints:
    """The server's k items for ``signal``: :func:`greedy` on the posterior weights. A
    deterministic function of the signal and public data (post-processing: it spends nothing
    beyond the device's ε)."""
    return greedy(population, posterior_weights(signal, population.embeddings, epsilon, radius), k)
