"""The float64 gem/mgem peel kernel that the exact peel replaced (recsvc/mechanisms/gem_peel.py
before issue 36's exact samplers), verbatim but for this docstring and the entry point, for
scripts.bench.exact_slates to time side by side. Not exact: its Bernoulli trials compare floats.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from recsvc.mechanisms import gem

_HEAVY = 8  # p̄ > 2^−8: a Bernoulli(p̄) trial each; below, only where a geometric skip lands
_LAST = 64  # the last level takes every p̄ ≤ 2^−64
_DENSE = 256  # more candidates above 2^−8 than this: draw densely
_LN2 = math.log(2.0)
_gem_t = numba.njit(cache=True, nogil=True)(gem.gem_t)  # the one formula, callable from the kernel


@numba.njit(cache=True, nogil=True)
def _skip(g: np.random.Generator, p: float) -> float:  # pragma: no cover - numba
    """Failures before the first success of Bernoulli(p) trials (a float: it may be astronomic)."""
    if p >= 1.0:
        return 0.0
    return math.floor(math.log(1.0 - g.random()) / math.log1p(-p))


@numba.njit(cache=True, nogil=True)
def _bound(a: int, s: np.ndarray, d: np.ndarray, top: int, half_eps: float) -> float:  # pragma: no cover - numba
    """ū_a ≥ u_a: the a' = T term of q'_a's min, times ε/2."""
    return min(0.0, float((s[a] - s[top]) / (d[a] + d[top]))) * half_eps


@numba.njit(cache=True, nogil=True)
def _level(ub: float) -> int:  # pragma: no cover - numba
    """b with e^{ū} ∈ (2^−b−1, 2^−b], capped at _LAST; rounding never puts e^{ū} above 2^−b."""
    if ub <= -_LAST * _LN2:
        return _LAST
    b = min(_LAST, int(-ub / _LN2))
    return b - 1 if b > 0 and math.exp(ub) > 2.0 ** (-b) else b


@numba.njit(cache=True, nogil=True)
def _heavy(s: np.ndarray, d: np.ndarray, half_eps: float) -> tuple[int, np.ndarray]:  # pragma: no cover - numba
    """The top point T (the first of the largest s) and the other candidates with p̄ > 2^−_HEAVY,
    in index order; the count stops past _DENSE, where a step draws densely anyway."""
    m = s.shape[0]
    top = 0
    for i in range(1, m):
        if s[i] > s[top]:
            top = i
    heavy = np.empty(m, np.int64)
    n = 0
    for a in range(m):
        if a != top and _bound(a, s, d, top, half_eps) > -_HEAVY * _LN2:
            heavy[n] = a
            n += 1
            if n > _DENSE:
                break
    return top, heavy[:n]


@numba.njit(cache=True, nogil=True)
def _step(
    s: np.ndarray, d: np.ndarray, half_eps: float, g: np.random.Generator, vertices: np.ndarray, known: bool
) -> tuple[int, np.ndarray, bool]:  # pragma: no cover - numba
    """One draw of argmax(u + E) for u = q'(s, d)·ε/2 (module docstring): an index into s, and
    the upper hull's vertices (``known``: ``vertices`` are this point set's; else built here if
    a trial succeeds). Whether it draws densely depends on s and Δ only, never on a draw."""
    m = s.shape[0]
    top, heavy = _heavy(s, d, half_eps)
    if heavy.shape[0] > _DENSE:  # a flat law: m exponentials cost less than the trials
        return _dense(s, d, half_eps, g), vertices, known
    # Successes of each candidate's Bernoulli(p) trial, with p and the uniform that thins them.
    hits = [0 for _ in range(0)]
    probs = [0.0 for _ in range(0)]
    thins = [0.0 for _ in range(0)]
    for a in heavy:  # levels below _HEAVY: one Bernoulli(p̄_a) trial each
        p_bar = math.exp(_bound(a, s, d, top, half_eps))
        if g.random() < p_bar:
            hits.append(a)
            probs.append(p_bar)
            thins.append(g.random())
    # level b ≥ _HEAVY: Bernoulli(2^−b) successes by geometric skips over every position; a
    # landing counts only for a candidate of this level (the others have their own trials)
    for b in range(_HEAVY, _LAST + 1):
        p_b = 2.0 ** (-b)
        pos = -1.0
        while True:
            pos += 1.0 + _skip(g, p_b)
            if pos >= m:
                break
            a = int(pos)
            if a == top:
                continue
            ub = _bound(a, s, d, top, half_eps)
            if ub > -_HEAVY * _LN2 or _level(ub) != b:
                continue
            hits.append(a)
            probs.append(p_b)
            thins.append(g.random())
    kept = [top]  # u = 0: always kept
    if len(hits) > 0:
        if not known:
            vertices = gem.hull_vertices(s, d)
            known = True
        hx, hy, edge = gem.hull_at(s, d, vertices)
        at = np.array(hits)
        u = gem.tangents(hx, hy, edge, d[at], s[at]) * half_eps
        for i in range(len(hits)):
            if thins[i] < math.exp(u[i]) / probs[i]:  # thinning: kept w.p. e^{u_a}/p
                kept.append(hits[i])
    return kept[g.integers(0, len(kept))], vertices, known


@numba.njit(cache=True, nogil=True)
def _dense(s: np.ndarray, d: np.ndarray, half_eps: float, g: np.random.Generator) -> int:  # pragma: no cover - numba
    """The same draw as rnm on q' (gem.py's sampler): every q'_a from the hull, m exponentials."""
    hx, hy, edge = gem.hull(s, d)
    z = gem.tangents(hx, hy, edge, d, s) * half_eps + g.standard_exponential(s.shape[0])
    return int(np.argmax(z))


@numba.njit(cache=True, nogil=True)
def _peel(
    q: np.ndarray, d: np.ndarray, sign: float, eps_step: float, beta: float, k: int, g: np.random.Generator
) -> np.ndarray:  # pragma: no cover - numba
    n = q.shape[0]
    alive = np.arange(n)  # the survivors, in their original order
    qq = q.copy()
    dd = d.copy()
    s = np.empty(n)
    out = np.empty(k, np.int64)
    # The upper hull's vertices carry over between steps: a change of t shears every point alike,
    # and dropping a point that is not a vertex leaves the hull as it was.
    vertices = np.empty(0, np.int64)
    known = False
    for i in range(k):
        m = n - i
        t = sign * _gem_t(m, eps_step, beta)
        for j in range(m):
            s[j] = qq[j] - t * dd[j]
        w, vertices, known = _step(s[:m], dd[:m], eps_step / 2.0, g, vertices, known)
        out[i] = alive[w]
        for j in range(w, m - 1):  # drop the winner, keeping the order
            alive[j] = alive[j + 1]
            qq[j] = qq[j + 1]
            dd[j] = dd[j + 1]
        if known:
            for j in range(vertices.shape[0]):
                if vertices[j] == w:
                    known = False
                elif vertices[j] > w:
                    vertices[j] -= 1
    return out


def peel_float(
    sign: float, q: np.ndarray, d: np.ndarray, eps_step: float, beta: float, k: int, g: np.random.Generator
) -> np.ndarray:
    """k peeled gem (sign 1) or mgem (sign −1) steps at ``eps_step``, in float64."""
    gem.checked_t(q, d, eps_step, beta)
    return _peel(np.ascontiguousarray(q, np.float64), np.ascontiguousarray(d, np.float64), sign, eps_step, beta, k, g)
