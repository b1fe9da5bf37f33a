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
:func:`dense_greedy` picks. Greedy on F_L computes every item's gain once (O(P·L)), then runs
lazily (:class:`_Lazy`): a pick recomputes only the gains of the few items that could beat it,
each over the users who hold that item in their top L, instead of O(P·n) per pick.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError
from recsvc.multiselection.embedding import Floats
from recsvc.multiselection.lattice import Lattice, lattice_log_likelihood
from recsvc.multiselection.posterior import Ints, Population, weights_from_log_likelihood

#: a marginal gain this small (relative to the best single item's) counts as none: the picks left
#: then follow the items' expected scores, not rounding.
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
    if (w > 0).all():  # the usual case: no copy of the population's rows
        sl, wg = slot.ravel(), (w[:, None] * gain).ravel()
    else:  # users with no weight change nothing
        live = np.flatnonzero(w > 0)
        sl, wg = slot[live].ravel(), (w[live, None] * gain[live]).ravel()
    alone = np.asarray(np.bincount(sl, weights=wg, minlength=n + 1)[:n], dtype=np.float64)
    tol = _TIE * max(float(alone.max()), np.finfo(np.float64).tiny)
    lazy = _Lazy(population, w, alone, k)
    picked = np.empty(k, np.int64)
    for step in range(k):
        j, value = lazy.best()
        if value <= tol:  # nothing adds anything: the items' expected scores decide
            j = int(np.argmax(alone))
        picked[step] = j
        alone[j] = -np.inf
        lazy.take(j)
    return picked


class _Lazy:
    """Lazy greedy (Minoux), vectorised: by submodularity an item's marginal gain only falls as
    items are picked, so a gain computed at an earlier step is an upper bound. Each step marks
    every bound stale, recomputes exactly the ``BATCH`` largest stale bounds at once (each over
    the users holding that item in their top L, from the inverse lists) until the largest bound
    is exact: that item is the best. Only the ``size`` items with the largest gains alone are
    tracked; should every tracked bound fall below the best untracked item's gain alone, all
    gains are recomputed and the tracked set refilled, so the answer is always the exact greedy's."""

    BATCH = 16

    def __init__(self, population: Population, w: Floats, alone: Floats, k: int) -> None:
        self.pop, self.w = population, w
        self.best_gain = np.zeros(population.size)  # each user's best gain over the items picked
        self.picked = np.zeros(population.num_items, bool)
        self.size = min(population.num_items, 64 + 16 * k)
        self._fill(alone)

    def _fill(self, gains: Floats) -> None:
        b = np.where(self.picked, -np.inf, gains)
        n = b.size
        top = np.argpartition(-b, self.size - 1)[: self.size] if self.size < n else np.arange(n)
        rest = np.ones(n, bool)
        rest[top] = False
        self.rest_bound = float(b[rest].max()) if rest.any() else -np.inf
        self.items = np.sort(top)  # ascending rows: a stable sort by bound breaks ties to the lower row
        self.bound = b[self.items]
        self.exact_now = np.zeros(self.items.size, bool)

    def _exact(self, sel: Ints) -> Floats:
        """The exact marginal gains of the tracked items at positions ``sel``."""
        ptr, users_of, gain_of = self.pop.by_item
        rows = self.items[sel]
        starts, lens = ptr[rows], ptr[rows + 1] - ptr[rows]
        total = int(lens.sum())
        ends = np.cumsum(lens)
        pos = np.arange(total) + np.repeat(starts - (ends - lens), lens)
        users = users_of[pos]
        vals = self.w[users] * np.maximum(gain_of[pos] - self.best_gain[users], 0.0)
        sums = np.zeros(rows.size)
        held = lens > 0  # reduceat needs strictly valid starts: items no user holds gain 0
        if total:
            sums[held] = np.add.reduceat(vals, (ends - lens)[held])
        return sums

    def best(self) -> tuple[int, float]:
        """The unpicked item with the largest marginal gain now, and that gain."""
        while True:
            order = np.argsort(-self.bound, kind="stable")
            first = int(order[0])
            if self.bound[first] < self.rest_bound:  # rare: an untracked item may be best
                self._fill(self._all_gains())
                continue
            if self.exact_now[first]:
                return int(self.items[first]), float(self.bound[first])
            stale = order[~self.exact_now[order]][: self.BATCH]
            self.bound[stale] = self._exact(stale)
            self.exact_now[stale] = True

    def take(self, j: int) -> None:
        self.picked[j] = True
        ptr, users_of, gain_of = self.pop.by_item
        users, g = users_of[ptr[j] : ptr[j + 1]], gain_of[ptr[j] : ptr[j + 1]]
        self.best_gain[users] = np.maximum(self.best_gain[users], g)
        self.bound[self.items == j] = -np.inf
        self.exact_now[:] = False  # every gain may have fallen: each bound is now only a bound

    def _all_gains(self) -> Floats:
        pop = self.pop
        lost = np.maximum(pop.gain - self.best_gain[:, None], 0.0) * self.w[:, None]
        return np.asarray(
            np.bincount(pop.slot.ravel(), weights=lost.ravel(), minlength=pop.num_items + 1)[: pop.num_items],
            dtype=np.float64,
        )


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


def respond_lattice(
    population: Population, points: Ints, signal: npt.ArrayLike, epsilon: float, lattice: Lattice, k: int
) -> Ints:
    """The server's k items for a lattice signal: :func:`greedy` on the posterior of the exact
    discrete Laplace likelihood, ``points`` the population's lattice points
    (``lattice.point(population.embeddings)``, in the device's units). A deterministic function
    of the signal and public data (post-processing: it spends nothing beyond the device's ε)."""
    return greedy(population, weights_from_log_likelihood(lattice_log_likelihood(signal, points, epsilon, lattice)), k)
