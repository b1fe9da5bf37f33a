"""One-shot top-k with noise on the items: ``oneshot`` (exponential noise) and ``gumbel``.

Each is defined by ONE noise value per candidate and the k largest noisy scores, in decreasing
order. Their scales are chosen for the whole slate (k items at ε), so a k-item slate is charged
ε once (docs/concepts/privacy-proofs.md#oneshot, #gumbel). Both are sampled exactly from that
real-number law:

* ``oneshot``: Z_a ~ Exponential(mean 2kΔmax/ε). At k = 1 this is ``rnm`` exactly. Sampled by
  the exact race of :mod:`recsvc.mechanisms.exact_race` (one pass, O(n) draws).
* ``gumbel``: Z_a ~ Gumbel(scale 2kΔmax/ε). Its ordered top k is distributed as k successive
  exponential-mechanism draws at ε/k, all with the full set's Δmax (Plackett–Luce); at k = 1
  it is ``em`` exactly. It is sampled that way, exactly (:mod:`recsvc.mechanisms.exact_peel`).

At k = 1 their samplers, exact probabilities and expectations are ``rnm``'s and ``em``'s (the
registry shares those functions). Inputs are validated ALREADY CLIPPED scores q (n,) and sensitivities Δ (n,); 1 ≤ k ≤ n is the
caller's check. Ties between noisy values have probability ~0; if one occurs, the lower index
ranks first (a fixed rule that does not look at the data).
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_peel import em_exact_peel, step_epsilon
from recsvc.mechanisms.exact_race import EXPONENTIAL, GapUtilities, race_top_k
from recsvc.mechanisms.noisy_max import rnm_sample
from recsvc.mechanisms.params import ParamValues

Slate = tuple[int, ...]


def _units(q: np.ndarray, d: np.ndarray, epsilon: float, k: int) -> npt.NDArray[np.float64]:
    """(q − max q) / scale with scale = 2kΔmax/ε: every value ≤ 0 and finite for any ε."""
    return cast("npt.NDArray[np.float64]", (q - q.max()) * (epsilon / (2.0 * k * d.max())))  # numpy: Any


# --- oneshot ---------------------------------------------------------------------------------------


def oneshot_top_k(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, k: int
) -> npt.NDArray[np.int64]:
    """The top k of q + Z, Z_a ~ Exponential(mean 2kΔmax/ε) drawn once, largest first.

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a ≤ Δmax. Randomness alignment: for an output
    o, raise each chosen item's noise by Δmax + q_a − q'_a ∈ [0, 2Δmax] and keep the others';
    on q' the chosen items keep their order and each stays above every other item (which rose by
    at most Δmax), the map is a translation, and the density falls by at most e^{−2kΔmax/scale}
    = e^{−ε}. This is the bound of OpenDP's make_noisy_top_k (k · range distance / scale).

    Sampled exactly: the top k of the real (q_a − q*)·ε/(2kΔmax) + E_a, E_a = −ln U_a for real
    uniforms U_a (:func:`recsvc.mechanisms.exact_race.race_top_k`), at every ε.
    """
    if k == 1:  # the same stream as rnm_sample, oneshot's one-item sampler
        return rnm_sample(q, d, epsilon, p, rng, 1).astype(np.int64)
    utilities = GapUtilities(q, epsilon, float(d.max()), 2 * k)  # (q − q*)/(2kΔmax/ε)
    return race_top_k(utilities, EXPONENTIAL, rng, k, ordered=True).astype(np.int64)


def oneshot_slate_log_probabilities(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, k: int
) -> dict[Slate, float]:
    """log P(ordered top k = s) for every ordered k-tuple s (small n: exact enumeration).

    In noise units X_b = u_b + E_b with E_b ~ Exponential(1). Going UP from −∞, item b appears
    at u_b and then dies (at X_b) at rate 1. Between consecutive distinct values t_j < t_{j+1}
    of u, every living item survives with probability e^{−(t_{j+1} − t_j)} independently, and
    the items dying in the same segment die in a uniformly random order (their residual lives
    are i.i.d. by memorylessness); above max u everyone dies, in uniform order. So the ranking
    sorts items by death segment (the last first), ties in uniform order: a sum of products of
    positive terms, with no cancellation and no quadrature.
    """
    u = _units(q, d, epsilon, k)
    n = u.shape[0]
    t = np.unique(u)
    r = t.shape[0]
    start = np.searchsorted(t, u)  # the segment in which each item appears
    seg = np.arange(r)
    with np.errstate(over="ignore"):
        alive = np.where(seg[None, :] >= start[:, None], np.exp(-(t[None, :] - u[:, None])), 1.0)  # P(D_b ≥ j)
    widths = np.diff(t)
    dies = alive.copy()  # P(D_b = j): alive at j's start, then dies within it (the last segment: surely)
    dies[:, :-1] *= np.where(seg[None, :-1] >= start[:, None], -np.expm1(-widths)[None, :], 0.0)
    dies[seg[None, :] < start[:, None]] = 0.0
    # P(D_b < j); the gap is clipped at 0 where the item has not appeared (the where's other arm)
    gap = np.maximum(t[None, :] - u[:, None], 0.0)
    below = np.where(seg[None, :] > start[:, None], -np.expm1(-gap), 0.0)
    out: dict[Slate, float] = {}
    for s in itertools.permutations(range(n), k):
        out[s] = _log_ranked(s, dies, below, n)
    return out


def _log_ranked(s: Slate, dies: np.ndarray, below: np.ndarray, n: int) -> float:
    """log P(s are the top k, in order) from each item's death-segment law (see above)."""
    r = dies.shape[1]
    # state: (segment of the last placed item, how many placed items share it) -> probability,
    # with 1/g! already applied to every closed group of g items in one segment
    states: dict[tuple[int, int], float] = {(j, 1): float(dies[s[0], j]) for j in range(r) if dies[s[0], j] > 0}
    for a in s[1:]:
        nxt: dict[tuple[int, int], float] = {}
        for (j, g), pr in states.items():
            if dies[a, j] > 0:
                nxt[(j, g + 1)] = nxt.get((j, g + 1), 0.0) + pr * float(dies[a, j])
            for j2 in range(j):
                if dies[a, j2] > 0:
                    nxt[(j2, 1)] = nxt.get((j2, 1), 0.0) + pr * float(dies[a, j2]) / math.factorial(g)
        states = nxt
    others = [b for b in range(n) if b not in s]
    total = 0.0
    for (j, g), pr in states.items():
        # the others: none dies after segment j; x of them die in it and rank below the g
        poly = np.array([1.0])
        for b in others:
            poly = np.convolve(poly, np.array([below[b, j], dies[b, j]]))
        tail = sum(float(c) / math.perm(g + x, g) for x, c in enumerate(poly))
        total += pr * tail
    return math.log(total) if total > 0 else -math.inf


# --- gumbel ----------------------------------------------------------------------------------------


def gumbel_top_k(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, k: int
) -> npt.NDArray[np.int64]:
    """The top k of q + G, G_a ~ Gumbel(scale 2kΔmax/ε) drawn once, largest first, sampled
    exactly as the k exponential-mechanism draws it is equal to in law
    (:func:`recsvc.mechanisms.exact_peel.em_exact_peel`, at ε′ ≤ ε/k: the largest float with
    k·ε′ ≤ ε).

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a ≤ Δmax. The ordered top k has the law of k
    exponential-mechanism draws without replacement, each P(a) ∝ exp((ε/k) q_a / 2Δmax) over
    the items left (Gumbel-max with the max-stability of the Gumbel law; Durfee & Rogers 2019),
    Δmax being the whole set's (public, and a bound for every subset). Each draw is
    (ε/k)-DP given the earlier ones, so the slate is ε-DP by basic composition.
    """
    return em_exact_peel(q, d, epsilon, k, rng)


def gumbel_slate_log_probabilities(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, k: int
) -> dict[Slate, float]:
    """log P(ordered top k = s): Plackett–Luce, Σ_i (x_{s_i} − log Σ_{b not in s_1..s_{i−1}} e^{x_b})."""
    from scipy.special import logsumexp  # imported on use: serving starts 0.35 s sooner

    x = _units(q, d, step_epsilon(epsilon, k), 1)  # the step ε the sampler runs at
    n = x.shape[0]
    out: dict[Slate, float] = {}
    for s in itertools.permutations(range(n), k):
        left = np.ones(n, dtype=bool)
        lp = 0.0
        for a in s:
            lp += float(x[a] - logsumexp(x[left]))
            left[a] = False
        out[s] = lp
    return out
