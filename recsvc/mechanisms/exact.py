"""Exact selection probabilities of noisy-max mechanisms by numerically stable 1-D quadrature.

Report-noisy-max with i.i.d. Exponential noise of mean λ (rnm, pf, and gem/mgem on q')::

    P(a) = ∫ f_a(y) Π_{b≠a} F_b(y) dy            (y ≥ q* = max q, else the product is 0)

Substituting s = exp(−(y − q*)/λ) ∈ (0, 1] turns every factor into a linear polynomial::

    P(a) = w_a ∫_0^1 Π_{b≠a} (1 − w_b s) ds,      w_b = exp((q_b − q*)/λ) ∈ (0, 1]

a polynomial of degree n − 1, which Gauss–Legendre with ⌈n/2⌉ + 1 nodes integrates EXACTLY.
All weights and integrand values are positive, so there is no cancellation (unlike the O(n²)
alternating-sum DP); we work in log space so that probabilities far below 1e-300 keep their
log. Cost O(n²/2) log1p evaluations (~1 ms at n = 500).

With i.i.d. Laplace noise (rnm_laplace) the same substitution handles y > q* exactly (weights
½w_b), y < min q is a closed form, and in between the integrand is smooth on each segment between
consecutive distinct scores: composite Gauss–Legendre there (:func:`laplace_noisy_max_log_probabilities`).

Where only an expected value E[v_A] is needed (the `auto` policy table averages expected errors
over a population at many ε), :func:`exponential_noisy_max_expectation` integrates it directly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import cast

import numba
import numpy as np
import numpy.typing as npt


@lru_cache(maxsize=64)
def _gauss_legendre_01(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and log-weights of m-point Gauss–Legendre on [0, 1]."""
    x, w = np.polynomial.legendre.leggauss(m)
    return (x + 1.0) / 2.0, np.log(w / 2.0)


def exponential_noisy_max_log_probabilities(log_w: np.ndarray) -> npt.NDArray[np.float64]:
    """log P(argmax(q + Z) = a) for Z_a i.i.d. Exponential(mean λ).

    ``log_w`` = (q − max q) / λ (all ≤ 0; the Laplace right tail passes log_w − log 2). Exact up to
    floating-point rounding (relative error ~1e-13), for any n and any ε.
    """
    from scipy.special import logsumexp  # imported on use: serving starts 0.35 s sooner

    log_w = np.asarray(log_w, dtype=np.float64)
    n = log_w.shape[0]
    s, log_weights = _gauss_legendre_01(n // 2 + 2)  # exact for degree ≤ n + 3 ≥ n − 1
    w = np.exp(log_w)
    terms = np.log1p(-np.multiply.outer(w, s))  # (n, m): log(1 − w_b s_j), all finite (s_j < 1)
    total = terms.sum(axis=0)
    # log ∫ Π_{b≠a} = logsumexp_j(log ω_j + Σ_b − term_a): the subtraction is exact in log space.
    log_integral = logsumexp(log_weights[None, :] + total[None, :] - terms, axis=1)
    return cast("npt.NDArray[np.float64]", log_w + log_integral)  # scipy is untyped: logsumexp is Any


# --- Laplace noise (rnm_laplace) -----------------------------------------------------------
# In units of the noise scale λ (u = (q − max q)/λ ≤ 0, X_b = u_b + standard Laplace) the
# reverse hazard f_a/F_a is 1 below u_a and h_a(x) = 1/(2e^{x−u_a} − 1) above it, so
#
#     P(a) = I(u_a) + ∫_{u_a}^∞ e^{S(x)} h_a(x) dx,   S = Σ_b log F_b,  I(y) = ∫_{−∞}^y e^{S}
#
# I is shared by all candidates (one cumulative sum). Three pieces:
#   x < min u : S is linear, closed form;
#   x > 0     : s = e^{−x} makes it exactly the Exponential case with weights ½e^{u_b} (a polynomial);
#   between   : on each segment between consecutive distinct u's the integrand is smooth (entire);
#               composite Gauss–Legendre on pieces whose log-variation is ≤ _LAP_VAR.
_LAP_NODES = ((0.05, 3), (1.0, 6), (np.inf, 12))  # (max log-variation of a piece, GL nodes)
_LAP_VAR = 8.0  # max log-variation of the integrand over one piece (rate × width)
_LAP_CUT = 45.0  # drop the part of a segment where the integrand is < e^{−cut} × its value at the right end
_LAP_FAR = 20.0  # u_b < x − far: log F_b and h_b to first order in e^{u_b − x} (error < e^{−2·far})
_LOG2 = float(np.log(2.0))


def _laplace_pieces(
    left: np.ndarray, right: np.ndarray, below: np.ndarray, log_w: np.ndarray, log_w_ex: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pieces (seg, lo, hi, variation) covering the non-negligible part of each segment [left, right].

    On a segment, log integrand' ∈ [below − 1, below + r(x)] with r(x) = W e^{−x} ≥ ψ'(x) (W = Σ
    of e^{u_b} over the u_b ≤ left, ψ = Σ of their log F_b). Both integrands rise at rate
    ≥ below − 1 and by ψ(right) − ψ(x) ≥ ½W'(e^{−x} − e^{−right}) (W' = W without its largest
    term, so it holds for every candidate): everything left of ``start`` is < e^{−cut} relative
    and dropped. Pieces have width ≤ _LAP_VAR / below (for below = 1 only within ``cut`` of the
    right end: further left only the flat h-part matters) and ≤ _LAP_VAR / r(x); where r is
    small they grow geometrically (the rest of the integrand decays like e^{−(x − left)}).
    """
    width = right - left
    cut = _LAP_CUT + np.log1p(width)
    start = left.copy()
    steep = below >= 2
    start[steep] = np.maximum(left[steep], right[steep] - cut[steep] / (below[steep] - 1))
    with np.errstate(divide="ignore"):
        x_psi = -np.logaddexp(-right, np.log(2.0 * cut) - log_w_ex)  # ½W'(e^{−x} − e^{−R}) = cut
    start = np.maximum(start, np.where(np.isfinite(log_w_ex), x_psi, -np.inf))
    window = np.where(steep, -np.inf, right - cut)  # below = 1: rate 1 (I-part) only near the right end
    seg, lo, hi, var = [], [], [], []
    x0 = start
    idx = np.arange(left.shape[0])
    active = x0 < right
    while active.any():
        i, x = idx[active], x0[active]
        rate = np.where(x >= window[i], below[i], 0.0)
        r = np.exp(np.minimum(log_w[i] - x, 700.0))
        with np.errstate(divide="ignore", over="ignore"):  # rate or r = 0: no limit from it
            d_exp = _LAP_VAR / rate
            d_psi = np.minimum(_LAP_VAR / r, x - left[i] + 1.0)
        stop = np.where(x < window[i], window[i], right[i])  # clamp to the point itself (no rounding past it)
        x1 = np.minimum(x + np.minimum(d_exp, d_psi), stop)
        x1 = np.where(right[i] - x1 <= 1e-12 * np.maximum(1.0, np.abs(right[i])), right[i], x1)
        x1 = np.maximum(x1, np.nextafter(x, np.inf))  # always progress, even where d < ulp(x)
        seg.append(i)
        lo.append(x)
        hi.append(x1)
        # few nodes only on short, nearly flat pieces (a wide piece may hide an e^{−x} layer)
        var.append(np.where(x1 - x <= 1.0, (x1 - x) * (rate + r), np.inf))
        x0[active] = x1
        active = x0 < right
    return np.concatenate(seg), np.concatenate(lo), np.concatenate(hi), np.concatenate(var)


def _laplace_nodes(
    seg: np.ndarray, lo: np.ndarray, hi: np.ndarray, var: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes, log-weights and segment of every piece, sorted by node."""
    xs, lws, segs = [], [], []
    lower = -np.inf
    for upper, m in _LAP_NODES:  # fewer nodes where a piece's integrand is nearly flat
        pick = (var > lower) & (var <= upper)
        lower = upper
        s01, lw01 = _gauss_legendre_01(m)
        a, b = lo[pick], hi[pick]
        xs.append((a[:, None] + (b - a)[:, None] * s01[None, :]).ravel())
        lws.append((np.log(b - a)[:, None] + lw01[None, :]).ravel())
        segs.append(np.repeat(seg[pick], m))
    x, lw, sg = np.concatenate(xs), np.concatenate(lws), np.concatenate(segs)
    order = np.argsort(x, kind="stable")
    return x[order], lw[order], sg[order]


def _laplace_log_cdf(z: np.ndarray) -> np.ndarray:
    """log F(z) of the standard Laplace distribution, stable for any z."""
    return np.where(z < 0, z - _LOG2, np.log1p(-0.5 * np.exp(-np.abs(z))))


def laplace_noisy_max_log_probabilities(u: np.ndarray, chunk: int = 256) -> np.ndarray:
    """log P(argmax(u + Z) = a) for Z_a i.i.d. standard Laplace (scale 1).

    ``u`` = (q − max q)/λ (all ≤ 0). Relative error ~1e-12 for every candidate (also for
    probabilities far below 1e-300, which keep their log), any n and any spread of u. At each
    chunk of nodes only the candidates within ``_LAP_FAR`` below them are evaluated densely
    (memory O(chunk × n)); the others enter through prefix sums, to first order in e^{u_b − x}.
    """
    from scipy.special import logsumexp  # imported on use: serving starts 0.35 s sooner

    u = np.asarray(u, dtype=np.float64)
    n = u.shape[0]
    order = np.argsort(u, kind="stable")
    us = u[order]
    t, pos, counts = np.unique(us, return_inverse=True, return_counts=True)  # t[-1] = 0
    # right tail x > 0: exactly the Exponential noisy max with weights ½e^{u_b}
    log_p = exponential_noisy_max_log_probabilities(us - _LOG2)
    # left tail x < min u: S(x) = n(x − log 2) − Σu, integrated in closed form
    log_left = n * (t[0] - _LOG2) - us.sum() - np.log(n)
    if t.shape[0] == 1:
        log_p = np.logaddexp(log_p, log_left)
    else:
        # segments [t_j, t_{j+1}]: `below` = #{u_b ≥ t_{j+1}}, W = Σ_{u_b ≤ t_j} e^{u_b}
        below = (n - np.cumsum(counts))[:-1].astype(np.float64)
        log_w = np.logaddexp.accumulate(np.log(counts) + t)[:-1]
        with np.errstate(divide="ignore", invalid="ignore"):  # W without its largest term e^{t_j}
            log_w_ex = np.where(log_w - t[:-1] > 1e-15, log_w + np.log(-np.expm1(t[:-1] - log_w)), -np.inf)
        x, log_omega, node_seg = _laplace_nodes(*_laplace_pieces(t[:-1], t[1:], below, log_w, log_w_ex))
        suffix_u = np.r_[np.cumsum(us[::-1])[::-1], 0.0]  # Σ_{b≥i} us_b, summed from the top (no cancellation)
        log_cum_eu = np.r_[-np.inf, np.logaddexp.accumulate(us)]  # log Σ_{b<i} e^{us_b}
        seg_mass = np.full(t.shape[0] - 1, -np.inf)
        log_h = np.full(n, -np.inf)
        for c0 in range(0, x.shape[0], chunk):
            xc = x[c0 : c0 + chunk]
            far = int(np.searchsorted(us, xc[0] - _LAP_FAR, side="left"))  # u_b < x − far for all xc
            top = int(np.searchsorted(us, xc[-1], side="right"))  # u_b > x for all xc from here
            z = xc[:, None] - us[None, far:top]
            # S(x) = Σ log F_b: dense near x, linear above, −½e^{u_b − x} (first order) far below
            s = _laplace_log_cdf(z).sum(axis=1) + (n - top) * (xc - _LOG2) - suffix_u[top]
            s -= 0.5 * np.exp(log_cum_eu[far] - xc)
            base = log_omega[c0 : c0 + chunk] + s
            np.logaddexp.at(seg_mass, node_seg[c0 : c0 + chunk], base)
            with np.errstate(divide="ignore"):
                # log h_a(x) = −z − log(2 − e^{−z}) for z = x − u_a > 0 (the h-part lives above u_a)
                lh = np.where(z > 0, -z - np.log1p(-np.expm1(-np.maximum(z, 0.0))), -np.inf)
            log_h[far:top] = np.logaddexp(log_h[far:top], logsumexp(base[:, None] + lh, axis=0))
            if far:  # h_a ≈ ½e^{u_a−x} + ¼e^{2(u_a−x)}: two node sums shared by all far candidates
                a1, a2 = logsumexp(base - xc), logsumexp(base - 2.0 * xc)
                uf = us[:far]
                far_h = np.logaddexp(uf - _LOG2 + a1, 2.0 * (uf - _LOG2) + a2)
                log_h[:far] = np.logaddexp(log_h[:far], far_h)
        log_cum = np.logaddexp.accumulate(np.r_[log_left, seg_mass])  # log I(t_j), j = 0..k
        log_p = np.logaddexp(np.logaddexp(log_p, log_h), log_cum[pos])
    out = np.empty(n)
    out[order] = log_p
    return out


# --- Expected values of the Exponential noisy max (the `auto` policy table) -----
# E[v_A] = Σ_a v_a P(a) = ∫_0^1 Σ_a w_a v_a Π_{b≠a} (1 − w_b s) ds
#        = ∫_0^1 Π_b (1 − w_b s) · Σ_a w_a v_a / (1 − w_a s) ds,
# the same polynomial of degree n − 1 as above, so the same Gauss–Legendre rule is exact; but
# one pass over (candidate, node) pairs with no n × m temporaries and no per-candidate log-sum:
# ~10× cheaper than the probabilities when only the expectation is needed.


@numba.njit(cache=True, nogil=True)
def _expectation_kernel(
    w: np.ndarray, wv: np.ndarray, s: np.ndarray, weights: np.ndarray
) -> float:  # pragma: no cover - numba
    total = 0.0
    for j in range(s.shape[0]):
        prod = 1.0  # may underflow to 0 far from s = 0: such a node's term is below 1e-308 × the first's
        acc = 0.0
        for b in range(w.shape[0]):
            y = 1.0 - w[b] * s[j]  # > 0: every node lies inside (0, 1)
            prod *= y
            acc += wv[b] / y
        total += weights[j] * prod * acc
    return total


@lru_cache(maxsize=64)
def _gauss_legendre_01_weights(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and (linear) weights of m-point Gauss–Legendre on [0, 1]."""
    s, log_weights = _gauss_legendre_01(m)
    return s, np.exp(log_weights)


def exponential_noisy_max_expectation(log_w: np.ndarray, values: np.ndarray) -> float:
    """E[values[argmax(q + Z)]] for Z_a i.i.d. Exponential(mean λ), ``log_w`` = (q − max q)/λ.

    ``values`` must be finite and ≥ 0 (every term is then positive: no cancellation). Equals
    ``exp(exponential_noisy_max_log_probabilities(log_w)) @ values`` to ~1e-13 relative: the
    product Π(1 − w_b s) is ≥ (1 − s_0)^n ≈ 1 − n·s_0 at the first node, so the terms that can
    underflow are negligible next to it.
    """
    log_w = np.asarray(log_w, dtype=np.float64)
    s, weights = _gauss_legendre_01_weights(log_w.shape[0] // 2 + 2)
    w = np.exp(np.maximum(log_w, -700.0))
    w[log_w < -700.0] = 0.0  # no subnormals (slow arithmetic); below e^-700 a weight is nil
    return float(_expectation_kernel(w, w * np.asarray(values, dtype=np.float64), s, weights))


# --- Two candidates: rnmh and random stopping (paper §V-A, Figures 3 and 15–17) -------------------
# Candidate 1 scores 0 with sensitivity d_low, candidate 2 scores gap > 0 with d_high. These give
# P(output = candidate 1), the lower-scoring one; arrays broadcast. Inputs are trusted (callers
# validate): gap > 0, sensitivities > 0, ε > 0, γ in (0, 1).


def rnmh_two_candidates_lower(gap: object, d_low: object, d_high: object, epsilon: object) -> npt.NDArray[np.float64]:
    """rnmh (Z_a ~ Exponential(mean 2Δ_a/ε)) picks the lower candidate iff Z_1 − Z_2 > gap, which has
    probability Δ_1/(Δ_1 + Δ_2) · exp(−ε·gap/(2Δ_1)) (paper §V-A; closed form)."""
    g, d1, d2, eps = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (gap, d_low, d_high, epsilon)))
    return cast("npt.NDArray[np.float64]", d1 / (d1 + d2) * np.exp(-eps * g / (2.0 * d1)))  # numpy ufuncs: Any


def random_stopping_two_candidates_lower(
    gap: object,
    d_low: object,
    d_high: object,
    epsilon: object,
    gamma: object,
    kind: str = "rs",
    low_share: float = 0.5,
) -> npt.NDArray[np.float64]:
    """rs (K ~ Geometric(γ), Laplace(3Δ_a/ε)) or rs_improved (K ~ Logarithmic(1−γ), Laplace(2Δ_a/ε)).

    Also for two GROUPS of tied candidates: a share w = ``low_share`` of them score 0 with Δ_low,
    the rest score ``gap`` with Δ_high (the bimodal scenarios); the result is then P(the output
    is one of the low ones). Each draw releases V = q_A + L, A uniform; with G the mixture CDF of
    V, the best of K draws is a low one with probability E_K[K ∫ w f_1 G^{K−1}] = ∫ w f_1(v) W(G(v)) dv,
    W(u) = γ/(1 − (1−γ)u)² (rs) or (1−γ)/(ln(1/γ)(1 − (1−γ)u)) (rs_improved). Substituting
    x = F_1(v) (so f_1 dv = dx, v = b_1·Laplace⁻¹(x)) gives w ∫_0^1 W(G(v(x))) dx: a bounded,
    positive integrand, smooth except at x = ½ (v = 0) and x = F_1(gap) (v = gap). Each of the
    three smooth pieces is mapped onto [0, 1], so every grid point shares the breakpoints and one
    vector-valued adaptive quadrature does them all. The result is ≥ wγ (one draw, a low one);
    the absolute error ≤ 1e-13·wγ keeps it relative."""
    from scipy import integrate

    if kind not in ("rs", "rs_improved"):
        raise ValueError(f"kind must be 'rs' or 'rs_improved', got {kind!r}")
    if not 0.0 < low_share < 1.0:
        raise ValueError(f"low_share must be in (0, 1), got {low_share!r}")
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (gap, d_low, d_high, epsilon, gamma)))
    g, d1, d2, eps, gam = (a.ravel() for a in arrays)
    if g.size == 0:
        return np.zeros(arrays[0].shape)
    c = 3.0 if kind == "rs" else 2.0
    b1, b2 = c * d1 / eps, c * d2 / eps
    tail = 0.5 * np.exp(-g / b1)  # 1 − F_1(gap)
    scale = np.log(1.0 / gam)
    w_low = float(low_share)

    def weight(v: np.ndarray, x: np.ndarray | float) -> npt.NDArray[np.float64]:  # w·W(G(v)) with F_1(v) = x
        z = (v - g) / b2
        f2 = np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))
        y = 1.0 - (1.0 - gam) * (w_low * x + (1.0 - w_low) * f2)
        w = w_low * (gam / (y * y) if kind == "rs" else (1.0 - gam) / (scale * y))
        return cast("npt.NDArray[np.float64]", w)  # numpy types ufunc results (np.exp above) as Any

    def integrand(s: float) -> npt.NDArray[np.float64]:
        # pieces [0, ½], [½, F_1(gap)], [F_1(gap), 1] in x, each mapped from s ∈ [0, 1]
        with np.errstate(divide="ignore"):  # s = 0 or 1 at the outer ends: v = ∓inf, F_2 = 0 or 1
            x0 = 0.5 * s  # x = ½s, v = b_1 ln(2x)
            left = 0.5 * weight(b1 * np.log(2.0 * x0), x0)
            r = 0.5 - (0.5 - tail) * s  # 1 − x = r from ½ down to `tail`
            mid = (0.5 - tail) * weight(-b1 * np.log(2.0 * r), 1.0 - r)
            r = tail * (1.0 - s)  # 1 − x = r from `tail` down to 0
            right = tail * weight(-b1 * np.log(2.0 * r), 1.0 - r)
        return cast("npt.NDArray[np.float64]", left + mid + right)  # `tail` comes from np.exp: Any

    val, _ = integrate.quad_vec(
        integrand, 0.0, 1.0, epsabs=1e-13 * w_low * float(gam.min()), epsrel=1e-11, norm="max", limit=100_000
    )
    return np.asarray(val, dtype=np.float64).reshape(arrays[0].shape)
