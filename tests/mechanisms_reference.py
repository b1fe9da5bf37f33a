"""Slow reference implementations that the mechanisms tests cross-check the fast code against.

Adaptive quadrature (scipy.integrate.quad) of the noise densities themselves, for small n and
heterogeneous scales (rnmh, the paper's counterexamples, rs/rs_improved): relative error ~1e-9.
It shares no code or substitution with recsvc.mechanisms.exact, so agreement is evidence.
"""

from __future__ import annotations

import numpy as np
from scipy import integrate


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
            for e0, e1 in zip(edges[:-1], edges[1:])
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
    n = q.shape[0]

    def mix_cdf(v: float) -> float:
        z = (v - q) / sc
        c = np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))
        return float(c.mean())

    def weight(v: float) -> float:
        x = (1.0 - gamma) * mix_cdf(v)
        if kind == "rs":
            return gamma / (1.0 - x) ** 2
        return (1.0 - gamma) / (np.log(1.0 / gamma) * (1.0 - x))

    out = np.empty(n)
    for a in range(n):

        def integrand(v: float, a: int = a) -> float:
            return float(0.5 * np.exp(-abs(v - q[a]) / sc[a]) / sc[a]) / n * weight(v)

        lo, hi = q[a] - width * sc[a], q[a] + width * sc[a]
        pts = np.unique(np.concatenate([q, q[a] + sc[a] * np.array([-1.0, 1.0])]))
        edges = np.concatenate([[lo], pts[(pts > lo) & (pts < hi)], [hi]])
        out[a] = sum(
            integrate.quad(integrand, e0, e1, epsabs=0.0, epsrel=1e-11, limit=200)[0]
            for e0, e1 in zip(edges[:-1], edges[1:])
        )
    return out
