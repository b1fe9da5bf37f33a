"""Test helpers for the selection mechanisms, reusable like ``numpy.testing``: privacy audits
driven by each mechanism's declaration, goodness of fit, and slow reference implementations to
cross-check the fast code against.

:func:`audit` takes a mechanism's NAME and reads its :class:`~recsvc.mechanisms.Privacy`
declaration (audit kind, parameter settings, reach, draws), so a mechanism registered later is
audited by the same code as the built-in ones, with nothing in the tests naming it. Pure numpy
and scipy; nothing here is imported by the package itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from scipy import integrate
from scipy.stats import beta as beta_dist
from scipy.stats import chi2

from recsvc.mechanisms.privacy import AuditKind
from recsvc.mechanisms.registry import MECHANISMS, log_probabilities, select_batch

SENS = np.array([0.05, 1.0, 3.0, 0.4, 1.7, 0.2, 2.5, 0.9, 0.6, 1.2])
TINY = 1e-6  # the paper uses Δ_1 = 0; every Δ must be > 0 (docs/reference/specification.md §1)
ALPHA = 1e-3  # overall false-positive rate of the statistical audit (Bonferroni over pairs)
N_AUDIT = 100_000  # draws per input of a statistical audit, unless its declaration says otherwise
TOL = 1e-9  # numerical tolerance of an exact audit on log-probabilities

Pair = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]
"""Neighbouring inputs (q, q', Δ) with |q_a − q'_a| ≤ Δ_a."""
Outcome = TypeVar("Outcome", bound=Hashable)


def vertex_pairs(n: int, seed: int) -> Iterator[Pair]:
    """(q, q', Δ): q' = q + δ with δ_a ∈ {−Δ_a, 0, +Δ_a} (every vertex of the neighbour box)."""
    rng = np.random.default_rng(seed)
    d = SENS[:n]
    q = rng.normal(size=n) * 2
    for signs in itertools.product((-1.0, 0.0, 1.0), repeat=n):
        if any(signs):
            yield q, q + np.array(signs) * d, d


def paper_pairs() -> Iterator[Pair]:
    """Adversarial neighbours from the paper (§IV-A, Appendix A and B), k = 2 … 6."""
    yield np.array([0.0, 0.5]), np.array([0.0, -0.5]), np.array([TINY, 1.0])  # §IV-A
    for k in (3, 6):
        d = np.r_[TINY, np.ones(k - 1)]
        yield np.zeros(k), np.r_[0.0, np.ones(k - 1)], d  # Appendix A
        yield np.ones(k), np.r_[1.0, np.zeros(k - 1)], d  # Appendix B


def box_vertex_pairs() -> list[Pair]:
    """The exact audit's neighbours: every box vertex at n = 2, 3, 4 (two seeds) and the paper's pairs."""
    return [p for n in (2, 3, 4) for seed in (0, 1) for p in vertex_pairs(n, seed)] + list(paper_pairs())


def max_loss(name: str, pairs: Iterable[Pair], eps: float, **params: object) -> float:
    """max over pairs and outcomes of |log P(o|q) − log P(o|q')| from exact probabilities."""
    worst = 0.0
    for q, q2, d in pairs:
        a = log_probabilities(name, q, d, eps, **params)
        b = log_probabilities(name, q2, d, eps, **params)
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def statistical_audit(
    name: str, pairs: Sequence[Pair], eps: float, seed: int, draws: int = N_AUDIT, **params: object
) -> float:
    """The largest certified lower bound on the privacy loss over ``pairs`` (``draws`` samples
    each; "> ε" proves a violation at overall false-positive rate ≤ ALPHA)."""
    a = ALPHA / len(pairs)
    worst = -np.inf
    for i, (q, q2, d) in enumerate(pairs):
        # user_offset given (its default) so that the type checker does not match **params against it
        x = select_batch(
            name, np.stack([q, q2]), d, eps, draws, seed + i, user_offset=0, allow_non_private=True, **params
        )
        cx, cy = (np.bincount(r, minlength=q.shape[0]) for r in x)
        worst = max(worst, certified_log_ratio(cx, cy, draws, a))
    return worst


def statistical_pairs() -> list[Pair]:
    """The statistical audit's neighbours: the corners of the box around 0 for Δ = (0.1, 2) and
    the paper's §IV-A pair (Δ_1 ≈ 0), where heterogeneous noise breaks privacy."""
    d = np.array([0.1, 2.0])
    signs = (np.array([1.0, -1.0]), np.array([-1.0, 1.0]), np.array([1.0, 0.0]))
    return [(np.zeros(2), s * d, d) for s in signs] + list(paper_pairs())[:1]


def chisquare_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson χ² goodness-of-fit p-value; cells with expected count < 5 are pooled into one.

    An observed count in a cell of probability exactly 0 gives p = 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    expected = np.asarray(probs, dtype=np.float64) * counts.sum()
    if ((expected == 0) & (counts > 0)).any():
        return 0.0
    small = expected < min_expected
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
        if expected[-1] == 0:
            counts, expected = counts[:-1], expected[:-1]
    if expected.shape[0] < 2:
        return 1.0
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, expected.shape[0] - 1))


def clopper_pearson(k: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided (1 − alpha) Clopper–Pearson interval for binomial proportions k/n."""
    k = np.asarray(k, dtype=np.float64)
    lo = np.where(k > 0, beta_dist.ppf(alpha / 2, k, n - k + 1), 0.0)
    hi = np.where(k < n, beta_dist.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return lo, hi


def certified_log_ratio(counts_x: np.ndarray, counts_y: np.ndarray, n: int, alpha: float) -> float:
    """A lower confidence bound on max_o |log P(o|x) − log P(o|y)| from two samples of size n.

    For every outcome o and both directions, log(L_x(o)/U_y(o)) with Clopper–Pearson bounds at
    level alpha / (2 · #outcomes) each (Bonferroni over all 2·#outcomes intervals): with probability ≥ 1 − alpha the returned value
    is ≤ the true privacy loss, so "returned > ε" proves a violation at false-positive rate ≤ alpha.
    """
    m = counts_x.shape[0]
    a = alpha / (2 * m)
    lx, ux = clopper_pearson(counts_x, n, a)
    ly, uy = clopper_pearson(counts_y, n, a)
    with np.errstate(divide="ignore"):
        ratios = np.concatenate([np.log(lx) - np.log(uy), np.log(ly) - np.log(ux)])
    return float(ratios.max())


def neighbour_vertices(q: np.ndarray, d: np.ndarray, count: int | None = None, seed: int = 0) -> list[np.ndarray]:
    """Neighbours q' = q + δ·Δ with δ_a ∈ {−1, 0, +1}, δ ≠ 0 (the vertices of the neighbour box).

    All 3^n − 1 of them, or ``count`` distinct ones drawn at random (seeded) for larger n.
    """
    n = q.shape[0]
    signs = np.array(list(itertools.product((-1.0, 0.0, 1.0), repeat=n)))
    signs = signs[np.any(signs != 0, axis=1)]
    if count is not None:
        signs = signs[np.random.default_rng(seed).choice(signs.shape[0], size=count, replace=False)]
    return [q + s * d for s in signs]


def max_log_ratio(log_p: Mapping[Outcome, float], log_p2: Mapping[Outcome, float]) -> float:
    """max over outcomes of |log P(o) − log P'(o)| (both dicts over the same outcomes; two
    zero probabilities count as equal, one zero against a positive one as ∞)."""
    worst = 0.0
    for o, a in log_p.items():
        b = log_p2[o]
        if a == b:  # also −∞ == −∞
            continue
        worst = max(worst, abs(a - b))
    return worst


# --- the audit a mechanism declares -------------------------------------------------------------


@dataclass(frozen=True)
class AuditResult:
    """One audit at one ε: ``loss`` is the worst privacy loss found (exact: over the pairs and
    outcomes; statistical: its certified lower bound; none: NaN, nothing to prove) and ``bound``
    the declared map's ε. ``passed``: loss ≤ bound; ``reached``: the loss attains the declared
    share of the bound (exact audits only; always True otherwise)."""

    name: str
    kind: AuditKind
    epsilon: float
    bound: float
    loss: float
    reach: float = 0.0

    @property
    def passed(self) -> bool:
        return self.kind is AuditKind.NONE or self.loss <= self.bound + (TOL if self.kind is AuditKind.EXACT else 0.0)

    @property
    def reached(self) -> bool:
        return self.loss >= self.reach * self.bound if self.reach else True


def audit(name: str, epsilon: float, pairs: Sequence[Pair] | None = None, seed: int = 100) -> AuditResult:
    """Audit mechanism ``name`` at ``epsilon`` the way its declaration says, at every declared
    parameter setting: exact (every box vertex at n ≤ 4 and the paper's pairs, unless ``pairs``
    are given) or statistical (:func:`statistical_pairs` unless given; ``seed`` fixes the draws)."""
    decl = MECHANISMS[name].privacy
    kind = decl.audit.kind
    bound = decl.privacy_map(epsilon)
    if kind is AuditKind.NONE:
        return AuditResult(name, kind, epsilon, bound, math.nan)
    if kind is AuditKind.EXACT:
        cases = box_vertex_pairs() if pairs is None else pairs
        loss = max(max_loss(name, cases, epsilon, **s) for s in decl.audit.settings)
    else:
        cases = statistical_pairs() if pairs is None else pairs
        loss = max(statistical_audit(name, cases, epsilon, seed, decl.audit.draws, **s) for s in decl.audit.settings)
    return AuditResult(name, kind, epsilon, bound, loss, decl.audit.reach)


def audited(kind: AuditKind) -> list[str]:
    """The registered mechanisms whose declared audit is of ``kind``, in registry order."""
    return [n for n, m in MECHANISMS.items() if m.privacy.audit.kind is kind]


# --- slow reference implementations ---------------------------------------------------------------
# Adaptive quadrature (scipy.integrate.quad) of the noise densities themselves, for small n and
# heterogeneous scales (rnmh, the paper's counterexamples, rs/rs_improved): relative error ~1e-9.
# It shares no code or substitution with recsvc.mechanisms.exact, so agreement is evidence.


def noisy_max_probabilities_quad(
    scores: np.ndarray, scales: np.ndarray, noise: str = "exponential", width: float = 60.0
) -> np.ndarray:
    """P(argmax(q + Z) = a) with independent Z_a of per-item ``scales`` (adaptive quadrature).

    ``noise`` is ``"exponential"`` (mean = scale) or ``"laplace"`` (scale b). Integrates over
    y within ``width`` scales of q_a, split at every q_b; meant for small n and for
    reference/audits (relative error ~1e-9 for probabilities that are not astronomically small).
    """
    q = np.asarray(scores, dtype=np.float64)
    sc = np.asarray(scales, dtype=np.float64)
    if noise not in ("exponential", "laplace"):
        raise ValueError(f"noise must be 'exponential' or 'laplace', got {noise!r}")
    n = q.shape[0]

    def cdf(y: float) -> np.ndarray:
        z = (y - q) / sc
        if noise == "exponential":
            return np.where(z > 0, -np.expm1(-np.maximum(z, 0.0)), 0.0)
        return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))

    def pdf(y: float, a: int) -> float:
        z = (y - q[a]) / sc[a]
        if noise == "exponential":
            return float(np.exp(-z) / sc[a]) if z >= 0 else 0.0
        return float(0.5 * np.exp(-abs(z)) / sc[a])

    out = np.empty(n)
    for a in range(n):
        others = np.delete(np.arange(n), a)
        lo = q[a] - (0.0 if noise == "exponential" else width * sc[a])
        if noise == "exponential" and n > 1:
            lo = max(lo, float(q[others].max()))  # the product of the other CDFs is 0 below
        # the integrand's mass sits above the others' maximum too: truncate relative to it
        hi = max(q[a], float(q[others].max()) if n > 1 else q[a]) + width * sc[a]
        if hi <= lo:
            out[a] = 0.0
            continue

        def integrand(y: float, a: int = a, others: np.ndarray = others) -> float:
            return pdf(y, a) * float(np.prod(cdf(y)[others]))

        pts = np.unique(np.concatenate([q, q[a] + sc[a] * np.array([-1.0, 1.0])]))
        pts = pts[(pts > lo) & (pts < hi)]
        edges = np.concatenate([[lo], pts, [hi]])
        out[a] = sum(
            integrate.quad(integrand, e0, e1, epsabs=0.0, epsrel=1e-11, limit=200)[0]
            for e0, e1 in itertools.pairwise(edges)
        )
    return out


def random_stopping_probabilities_quad(
    scores: np.ndarray, sensitivities: np.ndarray, epsilon: float, gamma: float, kind: str = "rs", width: float = 60.0
) -> np.ndarray:
    """P(output = a) of ``rs`` / ``rs_improved`` by adaptive quadrature (small n; audits/tests).

    One draw releases V = q_A + Laplace(cΔ_A/ε) with A uniform, so V has the mixture CDF
    F(v) = (1/n) Σ_b F_b(v). The best of K i.i.d. draws is a with probability
    K ∫ (f_a(v)/n) F(v)^{K−1} dv; summing over the law of K in closed form gives::

        rs (c = 3, K ~ Geometric(γ)):             P(a) = ∫ (f_a/n) γ / (1 − (1−γ)F)² dv
        rs_improved (c = 2, K ~ Logarithmic(1−γ)): P(a) = ∫ (f_a/n) (1−γ) / (ln(1/γ) (1 − (1−γ)F)) dv
    """
    q = np.asarray(scores, dtype=np.float64)
    sc = (3.0 if kind == "rs" else 2.0) * np.asarray(sensitivities, dtype=np.float64) / epsilon
    if kind not in ("rs", "rs_improved"):
        raise ValueError(f"kind must be 'rs' or 'rs_improved', got {kind!r}")
    n: int = q.shape[0]

    def mix_cdf(v: float) -> float:
        z = (v - q) / sc
        c = np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))
        return float(c.mean())

    def weight(v: float) -> float:
        x = (1.0 - gamma) * mix_cdf(v)
        if kind == "rs":
            return gamma / (1.0 - x) ** 2
        return (1.0 - gamma) / (float(np.log(1.0 / gamma)) * (1.0 - x))

    out = np.empty(n)
    for a in range(n):

        def integrand(v: float, a: int = a) -> float:
            return float(0.5 * np.exp(-abs(v - q[a]) / sc[a]) / sc[a]) / n * weight(v)

        lo, hi = q[a] - width * sc[a], q[a] + width * sc[a]
        pts = np.unique(np.concatenate([q, q[a] + sc[a] * np.array([-1.0, 1.0])]))
        edges = np.concatenate([[lo], pts[(pts > lo) & (pts < hi)], [hi]])
        out[a] = sum(
            integrate.quad(integrand, e0, e1, epsabs=0.0, epsrel=1e-11, limit=200)[0]
            for e0, e1 in itertools.pairwise(edges)
        )
    return out


# Reference probabilities of the mechanisms without an exact form: (q, Δ, ε, own params) → P(output).
REFERENCE = {
    "rnmh": lambda q, d, eps, **p: noisy_max_probabilities_quad(q, 2 * d / eps, "exponential"),
    "rs": lambda q, d, eps, gamma, **p: random_stopping_probabilities_quad(q, d, eps, gamma, "rs"),
    "rs_improved": lambda q, d, eps, gamma, **p: random_stopping_probabilities_quad(q, d, eps, gamma, "rs_improved"),
}


# --- one-shot top-k references -------------------------------------------------------------------
# Written from the definitions, sharing no code with recsvc.mechanisms.topk / clm.


def noisy_top_k_probabilities_quad(
    u: np.ndarray, noise: str = "exponential", k: int = 2
) -> dict[tuple[int, ...], float]:
    """P(the k largest of u + N, in order, are s) for every ordered k-tuple s, N_a i.i.d. standard
    ``"exponential"`` or ``"gumbel"``, by adaptive quadrature (k ≤ 2: one 1-D integral each):

        P(s) = ∫ f_{s_k}(y) Π_{b ∉ s} F_b(y) · P(X_{s_1} > y) dy       (k = 2; k = 1 without the last factor)
    """
    u = np.asarray(u, dtype=np.float64)
    if noise not in ("exponential", "gumbel") or k not in (1, 2):
        raise ValueError("noise must be 'exponential' or 'gumbel' and k 1 or 2")
    n = u.shape[0]

    def cdf(y: float, b: int) -> float:
        z = y - u[b]
        if noise == "exponential":
            return float(-np.expm1(-z)) if z > 0 else 0.0
        return float(np.exp(-np.exp(-z)))

    def pdf(y: float, b: int) -> float:
        z = y - u[b]
        if noise == "exponential":
            return float(np.exp(-z)) if z > 0 else 0.0
        return float(np.exp(-z - np.exp(-z)))

    out = {}
    for s in itertools.permutations(range(n), k):
        last, others = s[-1], [b for b in range(n) if b not in s]

        def integrand(y: float, last: int = last, others: list[int] = others, s: tuple[int, ...] = s) -> float:
            v = pdf(y, last) * math.prod(cdf(y, b) for b in others)
            return v * (1.0 - cdf(y, s[0])) if k == 2 else v

        lo = float(u[last]) if noise == "exponential" else float(u.min()) - 40.0
        edges = np.unique(np.r_[lo, u[u > lo], float(u.max()) + 60.0])
        out[s] = sum(
            integrate.quad(integrand, e0, e1, epsabs=0.0, epsrel=1e-11, limit=200)[0]
            for e0, e1 in itertools.pairwise(edges)
        )
    return out


def clm_loss(x: np.ndarray, subset: Sequence[int], gamma: float) -> float:
    """clm's loss of a subset from its definition: (1 − γ)·max(a, b) − γ·a with a the worst
    chosen and b the best left out (−∞ when nothing is left out)."""
    inside = np.zeros(x.shape[0], dtype=bool)
    inside[list(subset)] = True
    a = float(x[inside].min())
    b = float(x[~inside].max()) if (~inside).any() else -math.inf
    return (1.0 - gamma) * max(a, b) - gamma * a


def linf_distance_to_top_k(x: np.ndarray, subset: Sequence[int]) -> float:
    """min ‖x − v‖∞ over the v whose top k (ties allowed) is ``subset``, by brute force: the cost
    of a threshold c, max(max_{i∈y}(c − x_i)⁺, max_{j∉y}(x_j − c)⁺), is convex and piecewise
    linear with kinks at the x_i and crossings at midpoints, so its minimum is at one of them."""
    inside = np.zeros(x.shape[0], dtype=bool)
    inside[list(subset)] = True
    points = np.r_[x, (x[:, None] + x[None, :]).ravel() / 2]
    up = np.maximum(points[:, None] - x[None, inside], 0.0).max(axis=1)
    down = np.maximum(x[None, ~inside] - points[:, None], 0.0).max(axis=1) if (~inside).any() else 0.0 * up
    return float(np.maximum(up, down).min())


def clm_direct_log_probabilities(
    q: np.ndarray, d: np.ndarray, epsilon: float, k: int, gamma: float
) -> dict[tuple[int, ...], float]:
    """log P(clm returns the set s) for every sorted k-subset s: report noisy max with
    Exponential(1) noise over ALL C(n, k) subsets on −(ε/2)·loss, its law by adaptive quadrature."""
    x = np.asarray(q, dtype=np.float64) / float(np.max(d))
    subsets = list(itertools.combinations(range(x.shape[0]), k))
    util = np.array([-0.5 * epsilon * clm_loss(x, s, gamma) for s in subsets])
    p = noisy_max_probabilities_quad(util, np.ones(len(subsets)), "exponential")
    return {s: float(np.log(v)) for s, v in zip(subsets, p, strict=True)}


def clm_direct_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, k: int, gamma: float, rng: np.random.Generator, size: int
) -> list[tuple[int, ...]]:
    """``size`` sets drawn by the definition: the argmax over all k-subsets of −(ε/2)·loss + E."""
    x = np.asarray(q, dtype=np.float64) / float(np.max(d))
    subsets = list(itertools.combinations(range(x.shape[0]), k))
    util = np.array([-0.5 * epsilon * clm_loss(x, s, gamma) for s in subsets])
    best = (util[None, :] + rng.standard_exponential((size, len(subsets)))).argmax(axis=1)
    return [subsets[int(i)] for i in best]


class Words:
    """A stand-in generator that hands the exact samplers (:mod:`recsvc.mechanisms.exact_sampling`)
    chosen 64-bit words, in order, and exact uniform integers for the choice within a group."""

    def __init__(self, words: Sequence[int], seed: int = 0, then: int | None = None) -> None:
        self.words = list(words)
        self.then = then  # the word given forever after ``words`` (None: asking for more fails)
        self._rng = np.random.default_rng(seed)
        self.bit_generator = _RawWords(self)  # for the kernels that read raw draws (clm_draw.py)

    def integers(self, low: int, high: int, size: int | None = None, dtype: Any = np.int64) -> Any:
        if high == 2**64:
            n = 1 if size is None else int(size)
            out, self.words = self.words[:n], self.words[n:]
            if len(out) < n and self.then is not None:
                out += [self.then] * (n - len(out))
            if len(out) < n:
                raise AssertionError("the sampler asked for more words than the audit planned")
            return np.array(out, dtype=np.uint64)
        return self._rng.integers(low, high, size, dtype=dtype)

    def random(self, size: int | tuple[int, ...] | None = None) -> Any:
        """Uniforms as numpy's ``random`` makes them: the next words' top 53 bits, times 2⁻⁵³."""
        shape = () if size is None else (size,) if isinstance(size, int) else tuple(size)
        words = self.integers(0, 2**64, size=int(np.prod(shape, dtype=np.int64)))
        return ((words >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)


def float_grid_law(log_p: np.ndarray) -> np.ndarray:
    """The exact law of inverse-CDF sampling on float64 probabilities with a 53-bit uniform
    (``searchsorted(cdf, u·total)``, u = k·2⁻⁵³): P(a) = #grid points mapped to a / 2⁵³, found by
    bisection on k for each boundary (the map is monotone in k)."""
    cdf = np.cumsum(np.exp(log_p - log_p.max()))
    total = cdf[-1]
    lo = np.zeros(cdf.shape[0], dtype=np.int64)  # first k whose u·total ≥ cdf[a] (the grid points below a's end)
    hi = np.full(cdf.shape[0], 2**53, dtype=np.int64)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        below = (mid.astype(np.float64) * 2.0**-53) * total < cdf
        lo, hi = np.where(below & (lo < hi), mid + 1, lo), np.where(~below & (lo < hi), mid, hi)
    ends = np.minimum(lo, 2**53)
    counts = np.diff(np.concatenate(([0], ends)))
    counts[-1] += 2**53 - ends[-1]
    return counts.astype(np.float64) * 2.0**-53


def delta(p: np.ndarray, p2: np.ndarray, epsilon: float) -> float:
    """The smallest δ with P(S) ≤ e^ε·P'(S) + δ for every set S of outputs, both directions."""
    e = math.exp(epsilon)
    return float(max(np.maximum(p - e * p2, 0.0).sum(), np.maximum(p2 - e * p, 0.0).sum()))


class _RawWords:
    """``random_raw`` of a :class:`Words`: the same words, from the same queue."""

    def __init__(self, words: Words) -> None:
        self._words = words

    def random_raw(self, size: int) -> Any:
        return self._words.integers(0, 2**64, size=size)
