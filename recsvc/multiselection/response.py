"""The server's best response to a 1-D Laplace signal, and its expected error
(docs/concepts/multi-selection.md has the derivations).

The device sends s = u + X with X ~ Laplace(0, 1/ε) and the server returns the k points s − a_i;
the device keeps the nearest to its private u, at disutility h(min_i |X − a_i|) for a
non-decreasing h. The server's best offsets minimise

    f_h(ε, k) = min over a_1 < … < a_k of E[min_i h(|X − a_i|)],

and, X being symmetric, the mirror of an optimal set is optimal too; the optima here are symmetric
about 0, so s + a_i names the same points.
Because h is non-decreasing, each a_i serves its Voronoi cell (between the midpoints to its
neighbours), and E[min_i h(|X − a_i|)] is a sum of one integral per cell.

For h(t) = t the optimum is a closed form (:func:`identity_offsets`, :func:`identity_error`):
with N = ⌊(k+1)/2⌋·⌈(k+1)/2⌉ the positive offsets are (1/ε)·log(N/r²), r = 1 … ⌊k/2⌋, mirrored,
with 0 added for odd k, and

    f(ε, k) = 1 / (ε(n + 1))         for k = 2n + 1,
    f(ε, k) = log(1 + 1/n) / ε       for k = 2n,

so ε·k·f(ε, k) increases to 2: the O(1/(εk)) of the source paper's Theorem 1.4, with constant 2.
For any other h, :func:`optimal_response` minimises a quadrature of the objective numerically.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError, check_int
from recsvc.multiselection.geographic import Floats, _epsilon, signal_cdf

Disutility = Callable[[Floats], Floats]
"""h: distances (an array, ≥ 0) to disutilities (an array of the same shape), non-decreasing."""

_GL_NODES = 48  # Gauss–Legendre nodes per finite piece: the integrand is analytic on each piece
_LAGUERRE_NODES = 48  # Gauss–Laguerre nodes per tail: exact for polynomial h of degree < 96
_PROBE_REACH = 60.0  # h is checked on [0, 60/ε]: the Laplace mass beyond it is e^{−60}
_PROBE_POINTS = 6001
_MC_CHUNK = 1 << 16  # draws per batch: bounds the memory of a large Monte Carlo run


@dataclass(frozen=True, eq=False)  # an array field: == would be ambiguous
class Response:
    """The server's offsets (ascending, in signal units) and their expected error at ε."""

    epsilon: float
    offsets: Floats
    error: float

    @property
    def k(self) -> int:
        return int(self.offsets.shape[0])


def _k(k: object) -> int:
    return check_int("k", k, 1)


def _offsets(offsets: npt.ArrayLike) -> Floats:
    a = np.asarray(offsets, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] == 0 or not np.all(np.isfinite(a)):
        raise ParamError("{offsets} must be a non-empty 1-D array of finite numbers")
    return np.sort(a)


# --- h(t) = t: closed forms -------------------------------------------------------------------


def identity_offsets(epsilon: float, k: int) -> Floats:
    """The optimal offsets for h(t) = t, ascending: P[X > a] = r²/(2N) at the r-th
    outermost positive offset, N = ⌊(k+1)/2⌋·⌈(k+1)/2⌉ (k = 3, ε = 1: [−log 4, 0, log 4])."""
    eps, k = _epsilon(epsilon), _k(k)
    n = k // 2
    big_n = ((k + 1) // 2) * ((k + 2) // 2)
    r = np.arange(n, 0, -1, dtype=np.float64)  # innermost first
    positive = (math.log(big_n) - 2.0 * np.log(r)) / eps
    middle = np.zeros(k % 2)
    return np.concatenate((-positive[::-1], middle, positive))


def identity_error(epsilon: float, k: int) -> float:
    """f(ε, k) = E[min_i |X − a_i|] at the optimal offsets: 1/(ε(n+1)) for k = 2n+1, and
    log(1 + 1/n)/ε for k = 2n."""
    eps, k = _epsilon(epsilon), _k(k)
    n = k // 2
    return (1.0 / (n + 1) if k % 2 else math.log1p(1.0 / n)) / eps


def _laplace_partial_mean(x: Floats) -> Floats:
    """∫_{−∞}^x t dF(t) for Laplace(0, 1): ½(x − 1)e^x below 0, −½(x + 1)e^{−x} above (0 at ±∞)."""
    with np.errstate(invalid="ignore"):  # ±∞ · 0 at the infinite cell edges, replaced by 0 below
        low = 0.5 * (x - 1.0) * np.exp(np.minimum(x, 0.0))
        high = -0.5 * (x + 1.0) * np.exp(-np.maximum(x, 0.0))
    return np.asarray(np.where(np.isinf(x), 0.0, np.where(x <= 0, low, high)))


def _cells(c: Floats) -> tuple[Floats, Floats]:
    """Each sorted point's Voronoi cell [lo, hi] on the line."""
    mid = (c[1:] + c[:-1]) / 2.0
    return np.concatenate(([-np.inf], mid)), np.concatenate((mid, [np.inf]))


def identity_expected_error(offsets: npt.ArrayLike, epsilon: float) -> float:
    """E[min_i |X − a_i|] for ANY offsets, exact: per cell [lo, hi] with point c,
    c(2F(c) − F(lo) − F(hi)) + M(lo) + M(hi) − 2M(c), M the partial mean (unit scale, then /ε)."""
    eps = _epsilon(epsilon)
    c = _offsets(offsets) * eps
    lo, hi = _cells(c)
    f, m = partial(signal_cdf, u=0.0, epsilon=1.0), _laplace_partial_mean  # F of Laplace(0, 1)
    per_cell = c * (2.0 * f(c) - f(lo) - f(hi)) + m(lo) + m(hi) - 2.0 * m(c)
    return float(per_cell.sum()) / eps


# --- any non-decreasing h: quadrature and a numeric optimiser -------------------------------


@lru_cache(maxsize=4)
def _legendre(m: int) -> tuple[Floats, Floats]:
    x, w = np.polynomial.legendre.leggauss(m)
    return np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)


@lru_cache(maxsize=4)
def _laguerre(m: int) -> tuple[Floats, Floats]:
    x, w = np.polynomial.laguerre.laggauss(m)
    return np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)


def _pieces(c: Floats) -> tuple[Floats, Floats, Floats]:
    """The finite pieces (lo, hi, point) of the unit-scale objective: every cell split at its
    point and at 0, so |x − c|·e^{−|x|} is smooth on each. The tails beyond min(c₁, 0) and
    max(c_k, 0) are left to Gauss–Laguerre."""
    lo_edge, hi_edge = _cells(c)
    lo_edge[0], hi_edge[-1] = min(c[0], 0.0), max(c[-1], 0.0)
    bounds: list[tuple[float, float, float]] = []
    for left, point, right in zip(lo_edge.tolist(), c.tolist(), hi_edge.tolist(), strict=True):
        for a, b in ((left, point), (point, right)):  # a point lies in its own cell
            cuts = (a, 0.0, b) if a < 0.0 < b else (a, b)
            bounds.extend((x, y, point) for x, y in itertools.pairwise(cuts) if y > x)
    arr = np.array(bounds, dtype=np.float64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def _unit_error(c: Floats, g: Disutility) -> float:
    """E[min_i g(|Y − c_i|)] for Y ~ Laplace(0, 1) and sorted c, in one call of g."""
    lo, hi, point = _pieces(c)
    t, w = _legendre(_GL_NODES)
    half = (hi - lo)[:, None] / 2.0
    x = lo[:, None] + half * (t[None, :] + 1.0)
    y, wy = _laguerre(_LAGUERRE_NODES)
    left_end, right_end = min(c[0], 0.0), max(c[-1], 0.0)
    # Tails: ∫_{R}^{∞} g(x − c_k)·½e^{−x} dx = ½e^{−R} ∫_0^∞ g(R − c_k + y) e^{−y} dy, and mirrored.
    distances = np.concatenate((np.abs(x - point[:, None]).ravel(), c[0] - left_end + y, right_end - c[-1] + y))
    values = np.asarray(g(distances), dtype=np.float64)
    n_fin = x.size
    finite = float(np.sum((half * w[None, :] * 0.5 * np.exp(-np.abs(x))).ravel() * values[:n_fin]))
    left = 0.5 * math.exp(left_end) * float(wy @ values[n_fin : n_fin + y.size])
    right = 0.5 * math.exp(-right_end) * float(wy @ values[n_fin + y.size :])
    return finite + left + right


def check_disutility(h: Disutility, epsilon: float) -> None:
    """A clear :class:`ParamError` unless ``h`` maps an array of distances to finite values of the
    same shape, non-decreasing on a fine grid of [0, 60/ε] (where the check is possible)."""
    eps = _epsilon(epsilon)
    t = np.linspace(0.0, _PROBE_REACH / eps, _PROBE_POINTS)
    values = np.asarray(h(t), dtype=np.float64)
    if values.shape != t.shape:
        raise ParamError(
            "the disutility {h} must map an array of distances to an array of the same shape, got shape {shape}",
            shape=str(values.shape),
        )
    if not np.all(np.isfinite(values)):
        raise ParamError("the disutility {h} must be finite on [0, {reach}]", reach=f"{t[-1]:g}")
    drops = np.flatnonzero(np.diff(values) < -1e-12 * np.maximum(1.0, np.abs(values[1:])))
    if drops.size:
        i = int(drops[0])
        raise ParamError(
            "the disutility {h} must be non-decreasing, got h({t0}) = {v0} > h({t1}) = {v1}",
            t0=f"{t[i]:g}",
            v0=f"{values[i]:g}",
            t1=f"{t[i + 1]:g}",
            v1=f"{values[i + 1]:g}",
        )


def _scaled(h: Disutility, eps: float) -> Disutility:
    """g(s) = h(s/ε): the objective in units of the noise scale, where Y = εX ~ Laplace(0, 1)."""

    def g(s: Floats) -> Floats:
        return np.asarray(h(s / eps), dtype=np.float64)

    return g


def expected_error(offsets: npt.ArrayLike, epsilon: float, h: Disutility | None = None) -> float:
    """E[min_i h(|X − a_i|)] for X ~ Laplace(0, 1/ε): exact for h = None (the identity), else
    Gauss–Legendre on each smooth piece and Gauss–Laguerre on the tails (relative error ~1e-12
    for a smooth h; a kink of h inside a piece costs accuracy)."""
    eps = _epsilon(epsilon)
    a = _offsets(offsets)
    if h is None:
        return identity_expected_error(a, eps)
    check_disutility(h, eps)
    return _unit_error(a * eps, _scaled(h, eps))


def optimal_response(epsilon: float, k: int, h: Disutility | None = None) -> Response:
    """The server's optimal k offsets and their expected error: the closed form for h = None
    (the identity), else a numeric minimum (BFGS from the identity's optimum and from the Laplace
    quantiles, the better kept; offsets accurate to ~1e-6/ε)."""
    eps, k = _epsilon(epsilon), _k(k)
    if h is None:
        return Response(eps, identity_offsets(eps, k), identity_error(eps, k))
    # Imported here: scipy.optimize takes 0.4 s to import, and `recsvc serve` never needs it.
    from scipy import optimize

    check_disutility(h, eps)
    g = _scaled(h, eps)

    def objective(c: Floats) -> float:
        return _unit_error(np.sort(c), g)

    q = (np.arange(k, dtype=np.float64) + 0.5) / k
    quantiles = np.where(q <= 0.5, np.log(2.0 * q), -np.log(2.0 * (1.0 - q)))
    best: tuple[float, Floats] | None = None
    for start in (identity_offsets(1.0, k), quantiles):
        res = optimize.minimize(objective, start, method="BFGS", options={"gtol": 1e-10})
        c = np.sort(np.asarray(res.x, dtype=np.float64))
        value = objective(c)
        if best is None or value < best[0]:
            best = (value, c)
    assert best is not None  # two starts above
    return Response(eps, best[1] / eps, best[0])


def monte_carlo_error(
    offsets: npt.ArrayLike, epsilon: float, n: int, rng: np.random.Generator, h: Disutility | None = None
) -> tuple[float, float]:
    """The mean of min_i h(|X − a_i|) over ``n`` draws of X ~ Laplace(0, 1/ε), and its standard
    error: an estimate of :func:`expected_error` that shares no code with it."""
    eps, n = _epsilon(epsilon), check_int("n", n, 2)
    a = _offsets(offsets)
    if h is not None:
        check_disutility(h, eps)  # the nearest point minimises h(distance) only for a non-decreasing h
    total = total_sq = 0.0
    for start in range(0, n, _MC_CHUNK):
        x = rng.laplace(0.0, 1.0 / eps, size=min(_MC_CHUNK, n - start))
        right = np.searchsorted(a, x).clip(max=a.shape[0] - 1)
        left = (right - 1).clip(min=0)
        d = np.minimum(np.abs(x - a[left]), np.abs(x - a[right]))
        loss = d if h is None else np.asarray(h(d), dtype=np.float64)
        total += float(loss.sum())
        total_sq += float(np.square(loss).sum())
    mean = total / n
    var = max(total_sq - n * mean * mean, 0.0) / (n - 1)
    return mean, math.sqrt(var / n)
