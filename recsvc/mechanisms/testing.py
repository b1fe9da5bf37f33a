"""Privacy audits and statistical helpers shared by the mechanisms tests: exact worst-case
neighbour checks, a Clopper–Pearson audit, goodness of fit. They take a mechanism's NAME, so a
mechanism registered by a test module is audited by the same code as the built-in ones."""

from __future__ import annotations

import itertools

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import chi2

from recsvc.mechanisms import log_probabilities, select_batch

SENS = np.array([0.05, 1.0, 3.0, 0.4, 1.7, 0.2, 2.5, 0.9, 0.6, 1.2])
TINY = 1e-6  # the paper uses Δ_1 = 0; SPEC requires Δ > 0
ALPHA = 1e-3  # overall false-positive rate of the statistical audit (Bonferroni over pairs)
N_AUDIT = 100_000


def vertex_pairs(n, seed):
    """(q, q', Δ): q' = q + δ with δ_a ∈ {−Δ_a, 0, +Δ_a} (every vertex of the neighbour box)."""
    rng = np.random.default_rng(seed)
    d = SENS[:n]
    q = rng.normal(size=n) * 2
    for signs in itertools.product((-1.0, 0.0, 1.0), repeat=n):
        if any(signs):
            yield q, q + np.array(signs) * d, d


def paper_pairs():
    """Adversarial neighbours from the paper (§IV-A, Appendix A and B), k = 2 … 6."""
    yield np.array([0.0, 0.5]), np.array([0.0, -0.5]), np.array([TINY, 1.0])  # §IV-A
    for k in (3, 6):
        d = np.r_[TINY, np.ones(k - 1)]
        yield np.zeros(k), np.r_[0.0, np.ones(k - 1)], d  # Appendix A
        yield np.ones(k), np.r_[1.0, np.zeros(k - 1)], d  # Appendix B


def box_vertex_pairs():
    """The exact audit's neighbours: every box vertex at n = 2, 3, 4 (two seeds) and the paper's pairs."""
    return [p for n in (2, 3, 4) for seed in (0, 1) for p in vertex_pairs(n, seed)] + list(paper_pairs())


def max_loss(name, pairs, eps, **params):
    """max over pairs and outcomes of |log P(o|q) − log P(o|q')| from exact probabilities."""
    worst = 0.0
    for q, q2, d in pairs:
        a = log_probabilities(name, q, d, eps, **params)
        b = log_probabilities(name, q2, d, eps, **params)
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def statistical_audit(name, pairs, eps, seed, **params):
    """The largest certified lower bound on the privacy loss over ``pairs`` (N_AUDIT draws each;
    "> ε" proves a violation at overall false-positive rate ≤ ALPHA)."""
    a = ALPHA / len(pairs)
    worst = -np.inf
    for i, (q, q2, d) in enumerate(pairs):
        x = select_batch(name, np.stack([q, q2]), d, eps, N_AUDIT, seed + i, allow_non_private=True, **params)
        cx, cy = (np.bincount(r, minlength=q.shape[0]) for r in x)
        worst = max(worst, certified_log_ratio(cx, cy, N_AUDIT, a))
    return worst


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


def max_log_ratio(log_p: dict, log_p2: dict) -> float:
    """max over outcomes of |log P(o) − log P'(o)| (both dicts over the same outcomes; two
    zero probabilities count as equal, one zero against a positive one as ∞)."""
    worst = 0.0
    for o, a in log_p.items():
        b = log_p2[o]
        if a == b:  # also −∞ == −∞
            continue
        worst = max(worst, abs(a - b))
    return worst
