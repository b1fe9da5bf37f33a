"""The canonical Lipschitz mechanism for top-k (``clm``; Shekelyan & Loukides 2022).

It picks a k-SUBSET y by report-noisy-max over all C(n, k) subsets: the value of y is
−(ε/2)·loss(y) + E_y with E_y ~ Exponential(1) i.i.d. In units x = q/Δmax, with
a(y) = min_{i∈y} x_i (the worst chosen) and b(y) = max_{j∉y} x_j (the best left out),

    loss(y) = (1 − γ)·max(a, b) − γ·a,        γ = ``loss_weight`` ∈ [0, 1]

At γ = ½ this is the canonical loss, the L∞ distance from x to the scores whose top k is y:
½·max(0, b − a). Both max(a, b) and a move by at most 1 when every x_i does, so the loss does
too, for every γ; the factor ε/2 (not ε) is the one for losses that may move in either
direction. Privacy proof: docs/concepts/privacy-proofs.md#clm.

The loss depends on y only through which sorted positions hold a and b, so the subsets fall
into k(n − k) + 1 utility classes (sorted order j_1, …, j_n, largest first; 1-based):

* the top class: {j_1, …, j_k}, a = x_[k] and (by the formula) max(a, b) = a;
* class (h, t), 0 ≤ h ≤ k − 1 < k < t ≤ n: the head j_1..j_h, NOT j_{h+1} (so b = x_[h+1]),
  the tail j_t (a = x_[t]) and a body of k − h − 1 items from j_{h+2}..j_{t−1}:
  C(t − h − 2, k − h − 1) subsets.

(Seed 004's restatement draws the body from j_{h+1}..j_{t−1}, C(t − h − 1, k − h − 1) subsets: that
counts sets containing j_{h+1}, which belong to a class of larger h, twice.) The winning class is
drawn exactly from Poisson processes that touch only the classes that can win (clm_draw.py: a
top-500 of 20,720 items has 10⁷ classes, a top-10 of 500 has 4,901, and a draw touches tens), and a
uniform subset of it is the answer. (The best noise of m i.i.d. Exponential(1) values is
−log(1 − U^{1/m}): :func:`first_item_means` draws every class's from one uniform, for many ε at
once.) The answer is a SET: the slate lists it in a uniformly random order, which carries no
information about the scores.
"""

from __future__ import annotations

import functools
import math
from typing import cast

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.clm_draw import draw_subset
from recsvc.mechanisms.clm_tape import strictly_decreasing
from recsvc.mechanisms.exact import _gauss_legendre_01
from recsvc.mechanisms.exact_race import EXPONENTIAL, GapUtilities, race_argmax
from recsvc.mechanisms.params import ParamSpec, ParamValues

LOSS_WEIGHT = ParamSpec(
    "loss_weight",
    0.5,
    0.0,
    1.0,
    "clm's loss weight γ on the worst chosen score (1 − γ on the best one left out; ½: the canonical loss)",
    low_inclusive=True,
    high_inclusive=True,
)

Slate = tuple[int, ...]

_NO_ORDER = np.empty(0, np.intp)  # writable, as argsort's: one compiled kernel for both
_LOG_V_EXACT = -700.0  # below this log v, −log(1 − e^{−v}) is −log v in double precision


@functools.lru_cache(maxsize=32)
def _class_shape(n: int, k: int) -> tuple[npt.NDArray[np.intp], np.ndarray]:
    """(h, t) and the log size of every class, top class first, as read-only arrays: they depend on
    n and k only, and the log-gamma terms are most of the cost of a draw at large n."""
    from scipy.special import gammaln  # imported on use: serving starts 0.35 s sooner

    hh, tt = np.meshgrid(np.arange(k), np.arange(k + 1, n + 1), indexing="ij")
    h = np.r_[k - 1, hh.ravel()].astype(np.intp)
    t = np.r_[k, tt.ravel()].astype(np.intp)
    body = k - h - 1
    pool = np.maximum(t - h - 2, 0)  # the top class (−1) has no body: its size is set below
    log_size = gammaln(pool + 1.0) - gammaln(body + 1.0) - gammaln(pool - body + 1.0)
    log_size[0] = 0.0
    ht = np.c_[h, t]
    for arr in (ht, log_size):
        arr.flags.writeable = False
    return ht, cast("np.ndarray", log_size)


def _class_loss(x_sorted: np.ndarray, k: int, gamma: float) -> np.ndarray:
    """Each class's loss, in :func:`_class_shape`'s order. Outside the top class t > k > h, so
    x_[t] ≤ x_[h+1] and max(a, b) = b: the loss (1 − γ)·x_[h+1] − γ·x_[t] is a sum of a term in h
    and a term in t, one outer sum (no gather over the 2·C-long index arrays)."""
    n = x_sorted.shape[0]
    a = x_sorted[k - 1]  # the top class: a = b = x_[k]
    loss = np.empty(1 + k * (n - k))
    loss[0] = (1.0 - gamma) * a - gamma * a
    np.add.outer((1.0 - gamma) * x_sorted[:k], -gamma * x_sorted[k:n], out=loss[1:].reshape(k, n - k))
    return loss


def classes(x_sorted: np.ndarray, k: int, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The utility classes of sorted scores (largest first): (h, t, log size), 1-based t, and
    each class's loss; the top class comes first as (k − 1, k)."""
    ht, log_size = _class_shape(x_sorted.shape[0], k)
    return ht, log_size, _class_loss(x_sorted, k, gamma)


def _sorted_order(q: np.ndarray) -> npt.NDArray[np.intp]:
    """The stable descending order of q. Distinct scores have one descending order, which the
    (several times faster) unstable sort finds too; ties or NaN need the stable sort, so that a
    seed gives the same slate on every machine."""
    neg = -q
    order = np.argsort(neg)
    ranked = neg[order]
    if bool((ranked[1:] > ranked[:-1]).all()):
        return order
    return np.argsort(neg, kind="stable")


def _setup(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, k: int
) -> tuple[npt.NDArray[np.intp], np.ndarray, np.ndarray, np.ndarray]:
    """(sorted order, classes (h, t), log sizes, utilities −(ε/2)·loss)."""
    order = _sorted_order(q)
    ht, log_size, loss = classes(centred_units(q[order], d, 0.5 * epsilon), k, float(p["loss_weight"]))
    return order, ht, log_size, np.negative(loss, out=loss)


def centred_units(q_sorted: np.ndarray, d: np.ndarray, scale: float) -> np.ndarray:
    """(q − max q)·scale/Δmax for q sorted descending: the top score is subtracted first, so the
    law is the same for q and q + c (dividing first rounds away the gaps of scores far from 0),
    and the values overflow only where the utilities themselves would."""
    return cast("np.ndarray", (q_sorted - q_sorted[0]) * (scale / d.max()))  # numpy: Any


def _negative_noise(log_size: np.ndarray, u: np.ndarray) -> np.ndarray:
    """−(the best of m_c Exponential(1) values) per uniform U of u (rows, classes): that best is
    −log(1 − U^{1/m_c}), with 1 − U^{1/m} computed as −expm1(log U / m)."""
    # log(−log U) ≥ log(−log(1 − 2⁻⁵³)) > −37: below this largest log size no log v nears −700
    tiny_possible = log_size.shape[0] > 0 and float(log_size.max()) > _LOG_V_EXACT - 40.0
    with np.errstate(divide="ignore"):  # in place: the draw is a handful of passes over every class
        w = np.log(u)
        np.negative(w, out=w)
        np.log(w, out=w)
        np.subtract(w, log_size, out=w)  # log v
        if tiny_possible:
            # e^{log v} would underflow and make the noise +inf; there 1 − e^{−v} = v to double
            # precision (the next term, v/2, is below 1e-304), so the noise is −log v itself
            tiny = w < _LOG_V_EXACT
            log_v = w[tiny]
        np.exp(w, out=w)  # v
        np.negative(w, out=w)
        np.expm1(w, out=w)
        np.negative(w, out=w)
        np.log(w, out=w)  # −noise
        if tiny_possible:
            w[tiny] = log_v
    return cast("np.ndarray", w)  # numpy: Any


def _ranks(q: np.ndarray) -> tuple[np.ndarray, npt.NDArray[np.intp]]:
    """q's values sorted descending, and its stable descending order: empty when the scores are
    distinct (the values alone, several times cheaper than their order, then find the members)."""
    xs = np.sort(q)[::-1].copy()  # contiguous, as q[order]: one compiled kernel for both
    if strictly_decreasing(xs):
        return xs, _NO_ORDER
    order = _sorted_order(q)  # ties: ranks need the stable order
    return q[order], order


def clm_top_k(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, k: int
) -> npt.NDArray[np.int64]:
    """A k-subset by the canonical Lipschitz mechanism, in uniformly random order.

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a ≤ Δmax: report noisy max with Exponential(1)
    noise over the subsets, on utilities −(ε/2)·loss whose loss moves by at most 1
    (McKenna & Sheldon 2020, Theorem 1, with sensitivity 1 and scale 2/ε).
    """
    if k == 1:
        return clm_sample(q, d, epsilon, p, rng, 1)
    xs, order = _ranks(q)
    return draw_subset(q, d, xs, order, k, epsilon, float(p["loss_weight"]), rng)


def clm_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.int64]:
    """One item (k = 1), ``size`` times: clm at k = 1 is report noisy max at γε (its loss is
    const − γ·x_a), so it is sampled by ``rnm``'s exact race at γε (no float δ at any ε;
    fl(γε) ≤ ε, so the draw is ε-DP). The same stream as :func:`clm_top_k` at k = 1.

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a ≤ Δmax (see :func:`clm_top_k`).
    """
    gap = GapUtilities(q, float(p["loss_weight"]) * epsilon, float(d.max()))
    return race_argmax(gap, EXPONENTIAL, rng, size).astype(np.int64)


def class_log_probabilities(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, k: int
) -> tuple[npt.NDArray[np.intp], np.ndarray, np.ndarray]:
    """(order, classes, log P(class)). With w_c = e^{util_c − max util} and m_c subsets each,

        P(c) = m_c w_c ∫_0^1 (1 − w_c s)^{m_c − 1} Π_{c' ≠ c} (1 − w_{c'} s)^{m_{c'}} ds,

    a polynomial of degree C(n, k) − 1 that Gauss–Legendre integrates exactly (small n)."""
    from scipy.special import logsumexp  # imported on use: serving starts 0.35 s sooner

    order, ht, log_size, util = _setup(q, d, epsilon, p, k)
    m = np.exp(log_size)
    total = float(m.sum())
    s, log_weights = _gauss_legendre_01(round(total) // 2 + 2)
    log_w = util - util.max()
    terms = np.log1p(-np.multiply.outer(np.exp(log_w), s))  # (classes, nodes)
    all_terms = (m[:, None] * terms).sum(axis=0)
    log_int = logsumexp(log_weights[None, :] + all_terms[None, :] - terms, axis=1)
    return order, ht, cast("np.ndarray", log_size + log_w + log_int)


def clm_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> npt.NDArray[np.float64]:
    order, ht, log_p = class_log_probabilities(q, d, epsilon, p, 1)
    out = np.empty(q.shape[0])
    out[order[ht[:, 1] - 1]] = log_p  # k = 1: class (0, t) is the single item j_t
    return out


def clm_slate_log_probabilities(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, k: int
) -> dict[Slate, float]:
    """log P(slate) for every ordered k-tuple: P(its set's class) / (class size · k!)."""
    import itertools

    order, ht, log_p = class_log_probabilities(q, d, epsilon, p, k)
    n = q.shape[0]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(1, n + 1)
    index = {(int(h), int(t)): i for i, (h, t) in enumerate(ht)}
    _, _, log_size, _ = _setup(q, d, epsilon, p, k)
    out: dict[Slate, float] = {}
    per_order = math.lgamma(k + 1)
    for s in itertools.permutations(range(n), k):
        c = index[class_of(sorted(int(rank[a]) for a in s), k)]
        out[s] = float(log_p[c] - log_size[c] - per_order)
    return out


def class_of(ranks: list[int], k: int) -> tuple[int, int]:
    """(h, t) of the subset holding these sorted 1-based ranks: h = the length of its prefix of
    the sorted order (at most k − 1), t = its worst rank (k for the top k)."""
    h = 0
    while h < k - 1 and ranks[h] == h + 1:
        h += 1
    return h, ranks[-1]


def first_item_means(
    q: np.ndarray,
    d: np.ndarray,
    epsilons: tuple[float, ...],
    p: ParamValues,
    k: int,
    values: np.ndarray,
    rng: np.random.Generator,
    trials: int,
) -> npt.NDArray[np.float64]:
    """Monte Carlo E[values[first item of clm_top_k]] at each ε, from ``trials`` class draws of
    :func:`clm_top_k` whose noise is shared by every ε (common random numbers: the noise does not
    depend on ε). The slate lists its set in uniform order, so the first item is a uniform member
    of the drawn class's uniform set: its expected value is averaged exactly over the class (the
    head, the body pool's mean times its k − h − 1 draws, the tail), not drawn."""
    order = _sorted_order(q)
    ht, log_size, loss = classes(centred_units(q[order], d, 1.0), k, float(p["loss_weight"]))
    neg = _negative_noise(log_size, rng.random((trials, loss.shape[0])))
    v = values[order]
    prefix = np.r_[0.0, np.cumsum(v)]  # prefix[i]: the first i ranks' sum
    h, t = ht[:, 0], ht[:, 1]
    pool = np.maximum(t - h - 2, 1)  # the body's pool (ranks h + 2 … t − 1); empty only with no body
    body = (k - h - 1) / pool * (prefix[t - 1] - prefix[np.minimum(h + 1, t - 1)])
    mean = np.where(t == k, prefix[k], prefix[h] + body + v[t - 1]) / k  # each class's mean value
    out = np.empty(len(epsilons))
    for i, eps in enumerate(epsilons):
        out[i] = mean[(loss * (-0.5 * eps) - neg).argmax(axis=-1)].mean()
    return out
