"""The gem/mgem peel's compiled pass: every step of a slate, each an exact exponential race
revealed a byte at a time (the law is :mod:`recsvc.mechanisms.exact_race`'s, on the real q').

**Bytes first.** A step's race is argmax_a (a_a + E_a), E_a = −ln U_a for i.i.d. real uniforms,
a_a = q'_a·ε/2 ≤ 0 (:class:`recsvc.mechanisms.gem.GemUtilities`). Each U_a's first 8 bits come
first, 8 candidates to a 64-bit word: U_a lies in [k/256, (k+1)/256), so E_a ≤ ln(256/k) (∞ at
k = 0) and E_a ≥ ln(256/(k+1)). The top point T (the first largest float s) has a_T ≥ −err
(each float term of its min is ≥ 0), so its real value is at least L = ln(256/(k_T+1)) − err.
A candidate whose upper bound (the a' = T term of its min, which bounds q'_a from above, plus
its byte's ln(256/k)) is below L cannot win; only the others, C, get a 64-bit word each, whose
top 45 bits complete their uniform's 53-bit cell, and the race among C is decided as
exact_race decides it (float bounds; the undecided step goes to its decimal slow path in
Python, with the same cells). Revealing bits lazily, in an order that depends on bits already
seen, leaves the U_a i.i.d. uniform: the output is the same function of the real uniforms.
A step costs m/8 words and |C| more (E|C| ≈ Σ_a e^{a_a − L} + m/256); C = {T} needs no hull.

**Resumable.** The pass runs until the slate is done, it needs more words for C (``NEED``: the
caller draws them and calls again; the step reruns on the same bytes), or a step is undecided
(``UNDECIDED``: C's indices and cells are left in the buffers; the caller decides the step and
calls again with its winner).

Assumption (beyond exact_race's): libm's ``log`` within 10⁻¹² relative for the byte table.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from recsvc.mechanisms import gem
from recsvc.mechanisms.exact_sampling import UNIT_ROUNDOFF as _U
from recsvc.stats import argsort_float

DONE, NEED, UNDECIDED = 0, 1, 2
_CELL = 2.0**-53
_TINY = 2.0**-1060
_SLACK = 2.0**-40  # relative: covers a few float roundings of the pruning bounds
_NOISE_ERR = 8.0 * _U * 37.0  # exact_race.EXPONENTIAL.error
_NOISE_MAG = 37.0


def byte_tables() -> tuple[np.ndarray, np.ndarray]:
    """(up, low): up[k] ≥ ln(256/k) (inf at k = 0), 0 ≤ low[k] ≤ ln(256/(k+1)), for bytes k."""
    up = np.array([math.inf] + [math.log(256.0 / k) * (1 + 1e-12) + 1e-12 for k in range(1, 256)])
    low = np.array([max(0.0, math.log(256.0 / (k + 1)) * (1 - 1e-12) - 1e-12) for k in range(256)])
    return up, low


UP, LOW = byte_tables()


@numba.njit(cache=True, nogil=True)
def _candidates(
    s: np.ndarray,
    d: np.ndarray,
    top: int,
    half_eps: float,
    err: float,
    bytes_: np.ndarray,
    up: np.ndarray,
    low: np.ndarray,
    cand: np.ndarray,
) -> int:  # pragma: no cover - numba
    """C (module docstring) into ``cand``, T first, from the step's bytes; returns |C|."""
    floor = low[bytes_[top]] - 2.0 * err - _SLACK  # < T's real value
    k_max = 0  # a byte above k_max rules its candidate out alone (a_a ≤ err; up decreases)
    while k_max < 255 and up[k_max + 1] + 2.0 * err + 2.0**-30 >= floor:
        k_max += 1
    cand[0] = top
    c = 1
    for a in range(s.shape[0]):
        if bytes_[a] > k_max or a == top:
            continue
        e_up = up[bytes_[a]]
        term = (s[a] - s[top]) / (d[a] + d[top])
        a_up = min(0.0, term) * half_eps * (1.0 - _SLACK) + err  # ≥ a_a (the a' = T term's bound)
        if a_up + e_up + _SLACK * (abs(a_up) + 8.0) >= floor:
            cand[c] = a
            c += 1
    return c


@numba.njit(cache=True, nogil=True)
def _lower_from(m: float, half_eps: float, r: float) -> float:  # pragma: no cover - numba
    """GemUtilities.lower from m ≤ 0, at most every float term of a_i's min."""
    low = m * (1.0 + 3.02 * _U) - 4.1 * _U * r
    return low * half_eps * (1.0 + 4.0 * _U) - 2.0**-1060


@numba.njit(cache=True, nogil=True)
def _lower_a(i: int, s: np.ndarray, d: np.ndarray, half_eps: float, r: float) -> float:  # pragma: no cover - numba
    """GemUtilities.lower: a rigorous lower bound of a_i from every float term of its min."""
    m = 0.0
    for j in range(s.shape[0]):
        m = min(m, (s[i] - s[j]) / (d[i] + d[j]))
    return _lower_from(m, half_eps, r)


@numba.njit(cache=True, nogil=True)
def _lead(la: float, x: float) -> float:  # pragma: no cover - numba
    """exact_race's lower bound of a_i + E_i from a lower bound la of a_i and i's cell at x."""
    z = -math.log(x + _CELL)
    return la + (z - _NOISE_ERR) - 3.0 * _U * (abs(la) + (abs(z) + _NOISE_ERR)) - _TINY


@numba.njit(cache=True, nogil=True)
def _race(
    s: np.ndarray,
    d: np.ndarray,
    vertices: np.ndarray,
    half_eps: float,
    r: float,
    err: float,
    cand: np.ndarray,
    xs: np.ndarray,
    c: int,
    d_min: float,
) -> tuple[int, float]:  # pragma: no cover - numba
    """The race among C on their cells xs, as exact_race decides it: (winner, lead) when the
    float bounds decide, else (−1, lead) with lead a lower bound of the float leader's value."""
    hx, hy, edge = gem.hull_at(s, d, vertices)
    idx = cand[:c]
    qp = gem.tangents(hx, hy, edge, d[idx], s[idx])
    scale = half_eps * (1.0 - 6.0 * _U)
    best, v_best, second = 0, -math.inf, -math.inf
    for r_ in range(c):
        v = qp[r_] * scale - math.log(xs[r_]) if xs[r_] > 0.0 else math.inf
        if v > v_best:
            best, v_best, second = r_, v, v_best
        elif v > second:
            second = v
    e_up = err + (_NOISE_ERR + 1.01 * _U * _NOISE_MAG) + _TINY
    hi = second if second == -math.inf else second + 1.01 * _U * abs(second) + e_up
    i, top = idx[best], idx[0]
    if best == 0:  # T (first in C): every float term of its min is ≥ 0, so a_T ≥ −err
        lead = _lead(-err, xs[best])
    else:  # each term (s_i − s_j)/(Δ_i + Δ_j) ≥ (s_i − s_T)/(Δ_i + min Δ) in float too; else all terms
        lead = _lead(_lower_from(min(0.0, (s[i] - s[top]) / (d[i] + d_min)), half_eps, r), xs[best])
        if not lead > hi:
            lead = _lead(_lower_a(i, s, d, half_eps, r), xs[best])
    return (int(i) if lead > hi else -1), lead


@numba.njit(cache=True, nogil=True)
def _drop(w: int, m: int, qq: np.ndarray, dd: np.ndarray, alive: np.ndarray) -> None:  # pragma: no cover - numba
    """The last survivor takes w's place (the race's law does not depend on the order)."""
    alive[w], qq[w], dd[w] = alive[m - 1], qq[m - 1], dd[m - 1]


@numba.njit(cache=True, nogil=True)
def _bridge(s: np.ndarray, d: np.ndarray, w: int, a: int, b: int) -> np.ndarray:  # pragma: no cover - numba
    """The upper hull from vertex a to vertex b of the points but w: only points strictly between
    them in x and on or above the chord a → b can be its inner vertices (the rest of the hull
    stays), so only those are sorted."""
    xa, ya, xb, yb = -d[a], s[a], -d[b], s[b]
    keep = np.empty(s.shape[0] + 2, np.int64)
    c = 0
    for i in range(s.shape[0]):
        x = -d[i]
        if i == w or not xa < x < xb:
            continue
        u = (xb - xa) * (s[i] - ya)
        v = (yb - ya) * (x - xa)
        if u - v >= -1e-12 * (abs(u) + abs(v)):
            keep[c] = i
            c += 1
    inner = keep[:c]
    order = np.empty(c + 2, np.int64)
    order[0] = a
    order[1 : c + 1] = inner[argsort_float(-d[inner])]
    order[c + 1] = b
    return gem.upper_hull(s, d, order)


@numba.njit(cache=True, nogil=True)
def _without(
    s: np.ndarray, d: np.ndarray, vertices: np.ndarray, w: int
) -> tuple[np.ndarray, bool]:  # pragma: no cover - numba
    """The hull's vertices once w is dropped, renumbered as :func:`_drop` moves the survivors,
    and whether they are known (w at either end of the hull: rebuilt at the next step instead)."""
    h = vertices.shape[0]
    j = -1
    for i in range(h):
        if vertices[i] == w:
            j = i
    if j == 0 or j == h - 1:
        return vertices, False
    if j > 0:
        mid = _bridge(s, d, w, vertices[j - 1], vertices[j + 1])
        out = np.empty(h - 3 + mid.shape[0], np.int64)
        out[: j - 1] = vertices[: j - 1]
        out[j - 1 : j - 1 + mid.shape[0]] = mid
        out[j - 1 + mid.shape[0] :] = vertices[j + 2 :]
        vertices = out
    else:
        vertices = vertices.copy()
    last = s.shape[0] - 1
    for i in range(vertices.shape[0]):
        if vertices[i] == last:
            vertices[i] = w
    return vertices, True


@numba.njit(cache=True, nogil=True)
def peel_pass(
    qq: np.ndarray,
    dd: np.ndarray,
    alive: np.ndarray,
    out: np.ndarray,
    ts: np.ndarray,
    eps_step: float,
    r_full: float,
    byte_block: np.ndarray,
    bases: np.ndarray,
    pool: np.ndarray,
    pos: int,
    step: int,
    winner: int,
    vertices: np.ndarray,
    known: bool,
    up: np.ndarray,
    low: np.ndarray,
    cand: np.ndarray,
    xs: np.ndarray,
) -> tuple[int, int, int, np.ndarray, bool, int, float]:  # pragma: no cover - numba
    """Steps ``step``… of the peel on the survivors qq[:m], dd[:m], alive[:m] (in place: the
    last takes each winner's place); step i's bytes start at byte_block[8·bases[i]], C's words
    are pool[pos:]; a ``winner`` ≥ 0 is the caller's decision of step ``step``. Returns (status,
    step, pool position, vertices, known, |C| or words needed, lead)."""
    n = qq.shape[0] + 0
    s = np.empty(n)
    d_min = dd.min()  # ≤ every survivor's Δ
    half_eps = eps_step * 0.5
    while step < out.shape[0]:
        m = n - step
        w = winner
        t = ts[step]
        top = 0
        for j in range(m):
            s[j] = qq[j] - t * dd[j]
            if s[j] > s[top]:
                top = j
        if w < 0 and m == 1:
            w = 0  # exact_race draws nothing for one candidate
        if w < 0:
            r = r_full + abs(t)
            err = 4.1 * _U * r * eps_step * 0.5 * (1.0 + 4.0 * _U) + 2.0**-1060
            bytes_ = byte_block[8 * bases[step] : 8 * bases[step] + m]
            c = _candidates(s[:m], dd[:m], top, half_eps, err, bytes_, up, low, cand)
            if c == 1:
                w = top
            else:
                if pos + c > pool.shape[0]:
                    return NEED, step, pos, vertices, known, c, 0.0
                for r_ in range(c):
                    k = np.uint64(bytes_[cand[r_]])
                    xs[r_] = float((k << np.uint64(45)) | (pool[pos + r_] >> np.uint64(19))) * _CELL
                pos += c
                if not known:
                    vertices = gem.hull_vertices(s[:m], dd[:m])
                    known = True
                w, lead = _race(s[:m], dd[:m], vertices, half_eps, r, err, cand, xs, c, d_min)
                if w < 0:
                    return UNDECIDED, step, pos, vertices, known, c, lead
        winner = -1
        out[step] = alive[w]
        if known:
            vertices, known = _without(s[:m], dd[:m], vertices, w)
        _drop(w, m, qq, dd, alive)
        step += 1
    return DONE, step, pos, vertices, known, 0, 0.0
