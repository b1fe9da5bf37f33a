"""clm's winning class drawn exactly by touching only the classes that can win.

:func:`recsvc.mechanisms.clm.clm_top_k` needs the class with the largest value u_c + N_c, where
u_c is the class's utility and N_c the best of its m_c Exponential(1) noises. Drawing one N_c per
class costs a uniform and five transcendental passes over all k(n − k) + 1 classes (10⁷ for a
top-500 of 20,720 items). This module draws the same maximum from Poisson processes instead.

The best of m Exponential(1) values shifted by u has P(V < v) = (1 − e^{u−v})^m = e^{−m·φ(v−u)},
φ(z) = −log(1 − e^{−z}): it is the largest point of a Poisson process on the line whose mass above
v is m·φ(v − u). The classes' processes are independent, so the largest point of their union is
the maximum and its owner the winning class. The classes are cells of a rectangle (h, t); over a
sub-rectangle R the utility is at most ū_R (largest h, smallest t) and the size at most m̄_R
(smallest h, largest t), so every cell's process is a thinning of the DOMINATING process with mass
|R|·m̄_R·φ(v − ū_R) above v, whose points are easy to draw from the top down (mass Γ_i, the sum of
i Exponential(1), sits at ū_R + φ(Γ_i / (|R| m̄_R)); φ is its own inverse). A heap holds each
rectangle's next point; the highest is either thinned (a uniform cell of R keeps it with
probability λ_c(v)/λ̄_R(v), the ratio of the intensities m/(e^{v−u} − 1)), or R is split in two and
the point handed to the half holding its (uniform) cell, kept with the ratio of the halves' and
R's intensities, while each half continues below v from its own dominating mass. The first point
kept by a cell is the largest point of the union: the winner, with exactly the law of the
exhaustive draw. Rectangles whose bounds are loose are split before thinning, so the work is a
few hundred heap steps where the exhaustive draw takes millions of classes.

**Exactly, on the real numbers.** That algorithm is a function of real uniforms; the code computes
that function, not a float64 imitation of it (docs/concepts/privacy-proofs.md#clm):

* ū_R and m̄_R are floats that bound the real utilities and sizes from above (so every thinning
  ratio is ≤ 1 on the reals); a 1-cell rectangle is thinned too, never taken as its cell.
* Every real quantity (the uniforms' logarithms, the points, the keep thresholds) is a node of a
  TAPE carrying a rigorous float enclosure [lo, hi]. A comparison the enclosures decide is decided
  (all but about one in 10¹² draws). One they do not is resolved by
  :mod:`recsvc.mechanisms.clm_resolve`, which evaluates both nodes in :mod:`decimal` at a
  precision that grows, with 64 more bits of each uniform involved every round (fresh words: the
  uniform's bits beyond its first 64), until they separate; the kernel is then run again on the
  same words with that decision given (``forced``), and goes on.
* What the split policy looks at (how loose a rectangle's bounds are) is float arithmetic on the
  inputs only: any policy gives the same law, and the rerun takes the same one.

A uniform U_j is the real number whose first 64 bits are the j-th raw word; the float path knows
its first 53 (the cell [K·2⁻⁵³, (K + 1)·2⁻⁵³]), so a word of all ones (U near 1, a tiny
exponential, a point far above every float bound) is a decision for the slow path, not a cap on
the noise. Assumptions: libm's ``log``, ``exp``, ``log1p``, ``expm1`` within 4 ulps and ``lgamma``
of an integer within 2⁻⁴² relative (tested against exact binomials); :mod:`decimal`'s ``ln`` and
``exp`` are correctly rounded by specification.

One numba call draws the class, the members and their order (:func:`draw_subset`). It reads a block
of the generator's raw 64-bit draws rather than the generator itself (numba's unboxing of a
Generator costs more than a whole draw at n = 500, k = 10); a call that runs out of them restarts
on the same draws followed by fresh ones (:func:`_run`). The helpers that take arrays and allocate
none are compiled with ``_nrt=False``: numba would otherwise count references to every array
argument on every call, atomics that made up a tenth of a draw at n = 500, k = 10 (1.30 → 1.20 ×
the float draw); one that allocated would not compile.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import TypeVar

import numba
import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.clm_resolve import Resolver
from recsvc.mechanisms.clm_tape import (
    DECISIONS,
    N_NODES,
    PENDING_X,
    PENDING_Y,
    Inputs,
    OutOfRandomness,
    Tape,
    TapeFull,
    Undecided,
    below,
    borrowing,
    class_utilities,
    enclosure_inputs,
    less,
    lgamma_table,
    log_size,
    log_size_bounds,
    n_add,
    n_const,
    n_log_add_exp,
    n_log_e,
    n_log_expm1,
    n_log_int,
    n_log_phi,
    n_log_size,
    n_log_u,
    n_phi_of_log,
    n_sub,
    n_util,
    util_bounds,
)

_T = TypeVar("_T")
_TIGHT = 1.0  # split a rectangle whose log intensity can vary by more than this across its cells


# --- the Poisson processes -------------------------------------------------------------------------
# A row is the top class (row 0) or a rectangle of classes: ints (h0, h1, t0, t1); bounds (ū, L):
# floats with ū ≥ every cell's real utility and e^L ≥ every cell's size; nodes (u, log mass,
# log Γ, v): ū (the top class: its exact utility), log(cells·e^L), log of the dominating mass
# above the current point (−1: none yet), and the current point.
_U, _LOG_MASS, _LOG_GAMMA, _V = 0, 1, 2, 3


@borrowing
def _new_rect(  # pragma: no cover - numba
    ops: np.ndarray,
    vals: np.ndarray,
    state: np.ndarray,
    xs: np.ndarray,
    cx: np.ndarray,
    lg: np.ndarray,
    k: int,
    ints: np.ndarray,
    bounds: np.ndarray,
    nodes: np.ndarray,
    h0: int,
    h1: int,
    t0: int,
    t1: int,
    u_cap: float,
    l_cap: float,
) -> None:
    """A rectangle's row; its bounds are capped by its parent's (also bounds of its cells)."""
    ints[0], ints[1], ints[2], ints[3] = h0, h1, t0, t1
    bounds[0] = min(util_bounds(xs, cx, h1, t0)[1], u_cap)
    bounds[1] = min(log_size_bounds(lg, k, h0, t1)[1], l_cap)
    nodes[_U] = n_const(ops, vals, state, bounds[0])
    cells = n_log_int(ops, vals, state, (h1 - h0 + 1) * (t1 - t0 + 1))
    nodes[_LOG_MASS] = n_add(ops, vals, state, cells, n_const(ops, vals, state, bounds[1]))
    nodes[_LOG_GAMMA] = -1
    nodes[_V] = -1


@borrowing
def _at(ops: np.ndarray, vals: np.ndarray, state: np.ndarray, nodes: np.ndarray) -> None:  # pragma: no cover - numba
    """The point of mass Γ: v = u + φ(Γ / mass)."""
    s = n_sub(ops, vals, state, nodes[_LOG_GAMMA], nodes[_LOG_MASS])
    nodes[_V] = n_add(ops, vals, state, nodes[_U], n_phi_of_log(ops, vals, state, s))


@borrowing
def _advance(  # pragma: no cover - numba
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, nodes: np.ndarray, raw: np.ndarray, cur: np.ndarray
) -> None:
    """Move a row to its next point below: Γ ← Γ + E."""
    log_e = n_log_e(ops, vals, state, raw, cur)
    g = nodes[_LOG_GAMMA]
    nodes[_LOG_GAMMA] = log_e if g < 0 else n_log_add_exp(ops, vals, state, g, log_e)
    _at(ops, vals, state, nodes)


@borrowing
def _looseness(  # pragma: no cover - numba
    a: np.ndarray, b: np.ndarray, lg: np.ndarray, k: int, ints: np.ndarray, bounds: np.ndarray
) -> tuple[float, float]:
    """How much the log intensity can vary across a rectangle's h range and across its t range
    (float64 arithmetic on the inputs: it only chooses where to split)."""
    h0, h1, t0, t1 = ints[0], ints[1], ints[2], ints[3]
    along_h = (bounds[1] - log_size(lg, k, h1, t1)) + (a[h1] - a[h0])
    along_t = (bounds[1] - log_size(lg, k, h0, t0)) + (b[t0] - b[t1])
    return along_h, along_t


@numba.njit(cache=True, nogil=True, inline="always")
def _higher(  # pragma: no cover - numba
    vals: np.ndarray, state: np.ndarray, forced: np.ndarray, slack: float, nodes: np.ndarray, i: int, j: int
) -> bool:
    """Row i's point is above row j's (on the reals points never tie)."""
    return less(vals, state, forced, slack, nodes[j, _V], nodes[i, _V])


@borrowing
def _push(  # pragma: no cover - numba
    vals: np.ndarray,
    state: np.ndarray,
    forced: np.ndarray,
    slack: float,
    nodes: np.ndarray,
    heap: np.ndarray,
    size: int,
    row: int,
) -> None:
    """Put ``row`` into the binary heap heap[:size] (which has room for it)."""
    i = size
    heap[i] = row
    while i:
        parent = (i - 1) // 2
        if not _higher(vals, state, forced, slack, nodes, heap[i], heap[parent]):
            return
        heap[i], heap[parent] = heap[parent], heap[i]
        i = parent


@numba.njit(cache=True, nogil=True, inline="always")
def _pop(  # pragma: no cover - numba
    vals: np.ndarray,
    state: np.ndarray,
    forced: np.ndarray,
    slack: float,
    nodes: np.ndarray,
    heap: np.ndarray,
    size: int,
) -> int:
    """Take the first row out of the binary heap heap[:size] (leaving size − 1 rows)."""
    first: int = heap[0]
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        best, left = i, 2 * i + 1
        if left < size and _higher(vals, state, forced, slack, nodes, heap[left], heap[best]):
            best = left
        if left + 1 < size and _higher(vals, state, forced, slack, nodes, heap[left + 1], heap[best]):
            best = left + 1
        if best == i:
            return first
        heap[i], heap[best] = heap[best], heap[i]
        i = best


@borrowing
def _keep_threshold(  # pragma: no cover - numba
    ops: np.ndarray, vals: np.ndarray, state: np.ndarray, log_m: int, l_bound: float, v: int, u_bound: int, u: int
) -> int:
    """log of the thinning ratio m/e^L · (e^{v−ū} − 1)/(e^{v−u} − 1) ≤ 0 (m, u: the kept
    process's size and utility; e^L, ū: the dominating one's)."""
    sizes = n_sub(ops, vals, state, log_m, n_const(ops, vals, state, l_bound))
    gap_bound = n_log_expm1(ops, vals, state, n_sub(ops, vals, state, v, u_bound))
    gap = n_log_expm1(ops, vals, state, n_sub(ops, vals, state, v, u))
    return n_add(ops, vals, state, sizes, n_sub(ops, vals, state, gap_bound, gap))


@numba.njit(cache=True, nogil=True)
def _winning_class(  # pragma: no cover - numba
    a: np.ndarray,
    b: np.ndarray,
    xs: np.ndarray,
    cx: np.ndarray,
    lg: np.ndarray,
    k: int,
    raw: np.ndarray,
    cur: np.ndarray,
    ops: np.ndarray,
    vals: np.ndarray,
    state: np.ndarray,
    forced: np.ndarray,
    slack: float,
) -> tuple[int, int]:
    """(h, t) of the winning class (the top class as (k − 1, k)). Row 0 is the top class (one class
    of one subset, its process exact), row 1 the whole rectangle; a heap of rows, each in it at most
    once, orders their current points."""
    n = xs.shape[0]
    cap = 64
    ints = np.empty((cap, 4), np.int64)
    bounds = np.empty((cap, 2))
    nodes = np.empty((cap, 4), np.int64)
    heap = np.empty(cap, np.int64)
    ints[0, 0], ints[0, 1], ints[0, 2], ints[0, 3] = k - 1, k - 1, k, k
    nodes[0, _U] = n_util(ops, vals, state, xs, cx, k - 1, k)
    nodes[0, _LOG_MASS] = n_const(ops, vals, state, 0.0)
    nodes[0, _LOG_GAMMA] = -1
    _advance(ops, vals, state, nodes[0], raw, cur)
    _push(vals, state, forced, slack, nodes, heap, 0, 0)
    rows = size = 1
    if n > k:
        _new_rect(ops, vals, state, xs, cx, lg, k, ints[1], bounds[1], nodes[1], 0, k - 1, k + 1, n, math.inf, math.inf)
        _advance(ops, vals, state, nodes[1], raw, cur)
        _push(vals, state, forced, slack, nodes, heap, size, 1)
        rows = size = 2
    while True:
        r = _pop(vals, state, forced, slack, nodes, heap, size)
        size -= 1
        if r == 0:
            return k - 1, k
        h0, h1, t0, t1 = ints[r, 0], ints[r, 1], ints[r, 2], ints[r, 3]
        cells = (h1 - h0 + 1) * (t1 - t0 + 1)
        v = nodes[r, _V]
        along_h, along_t = _looseness(a, b, lg, k, ints[r], bounds[r])
        if cells > 1 and along_h + along_t > _TIGHT:
            # split: the point goes to the half holding its uniform cell, kept with the ratio of
            # the half's intensity to r's; each half goes on below v from its own mass
            if rows + 2 > cap:
                cap *= 2
                ints = np.concatenate((ints, np.empty_like(ints)))
                bounds = np.concatenate((bounds, np.empty_like(bounds)))
                nodes = np.concatenate((nodes, np.empty_like(nodes)))
                heap = np.concatenate((heap, np.empty_like(heap)))
            lo, hi = rows, rows + 1
            rows += 2
            u_cap, l_cap = bounds[r, 0], bounds[r, 1]
            if t1 > t0 and (along_t >= along_h or h1 == h0):
                mid = (t0 + t1) // 2
                _new_rect(
                    ops, vals, state, xs, cx, lg, k, ints[lo], bounds[lo], nodes[lo], h0, h1, t0, mid, u_cap, l_cap
                )
                _new_rect(
                    ops, vals, state, xs, cx, lg, k, ints[hi], bounds[hi], nodes[hi], h0, h1, mid + 1, t1, u_cap, l_cap
                )
            else:
                mid = (h0 + h1) // 2
                _new_rect(
                    ops, vals, state, xs, cx, lg, k, ints[lo], bounds[lo], nodes[lo], h0, mid, t0, t1, u_cap, l_cap
                )
                _new_rect(
                    ops, vals, state, xs, cx, lg, k, ints[hi], bounds[hi], nodes[hi], mid + 1, h1, t0, t1, u_cap, l_cap
                )
            cell = below(cells, raw, cur)
            lo_cells = (ints[lo, 1] - ints[lo, 0] + 1) * (ints[lo, 3] - ints[lo, 2] + 1)
            holder = lo if cell < lo_cells else hi
            for half in (lo, hi):
                f = nodes[half]
                z = n_sub(ops, vals, state, v, f[_U])  # v − ū_half > 0
                f[_LOG_GAMMA] = n_add(
                    ops, vals, state, f[_LOG_MASS], n_log_phi(ops, vals, state, z)
                )  # its mass above v
                keep = False
                if half == holder:
                    log_m = n_const(ops, vals, state, bounds[half, 1])
                    threshold = _keep_threshold(ops, vals, state, log_m, l_cap, v, nodes[r, _U], f[_U])
                    keep = less(vals, state, forced, slack, n_log_u(ops, vals, state, raw, cur), threshold)
                if keep:
                    f[_V] = v
                else:
                    _advance(ops, vals, state, f, raw, cur)
                _push(vals, state, forced, slack, nodes, heap, size, half)
                size += 1
            continue
        # thin: a uniform cell keeps the point with the ratio of its intensity to the bound
        cell = below(cells, raw, cur) if cells > 1 else 0
        width = t1 - t0 + 1
        h, t = h0 + cell // width, t0 + cell % width
        u = n_util(ops, vals, state, xs, cx, h, t)
        threshold = _keep_threshold(
            ops, vals, state, n_log_size(ops, vals, state, lg, k, h, t), bounds[r, 1], v, nodes[r, _U], u
        )
        if less(vals, state, forced, slack, n_log_u(ops, vals, state, raw, cur), threshold):
            return h, t
        _advance(ops, vals, state, nodes[r], raw, cur)
        _push(vals, state, forced, slack, nodes, heap, size, r)
        size += 1


@numba.njit(cache=True, nogil=True)
def _slate_kernel(  # pragma: no cover - numba
    q: np.ndarray,
    d: np.ndarray,
    xs: np.ndarray,
    order: np.ndarray,
    lg: np.ndarray,
    k: int,
    epsilon: float,
    gamma: float,
    slack: float,
    raw: np.ndarray,
    ops: np.ndarray,
    vals: np.ndarray,
    state: np.ndarray,
    forced: np.ndarray,
) -> np.ndarray:
    """clm's k-subset of scores q with sensitivities d (``xs``: q sorted descending): the winning
    class of the utilities of (xs − xs[0])·(ε/2)/Δmax, then a uniform member in uniformly random
    order: the head j_1..j_h, k − h − 1 of the pool j_{h+2}..j_{t−1} (a partial Fisher–Yates shuffle) and the tail j_t (the top class:
    j_1..j_k). Ranks come from ``order`` (the stable descending order) or, when it is empty (the
    scores are distinct), from the values: the head is q ≥ x_[h], the pool x_[t] < q < x_[h+1] and
    the tail q = x_[t], one pass over q instead of an argsort."""
    state[N_NODES] = state[DECISIONS] = 0
    n = q.shape[0]
    scale = d[0]
    for i in range(1, n):
        scale = max(scale, d[i])
    x = np.empty(n)
    unit = 0.5 * epsilon / scale  # in utility units, the top score subtracted first (clm.centred_units)
    for i in range(n):
        x[i] = (xs[i] - xs[0]) * unit
    a, b, _ = class_utilities(x, k, gamma, 2.0)
    cx = enclosure_inputs(epsilon, scale, gamma)
    cur = np.zeros(1, np.int64)
    h, t = _winning_class(a, b, xs, cx, lg, k, raw, cur, ops, vals, state, forced, slack)
    out = np.empty(k, np.int64)
    top = t == k
    pool = np.empty(0 if top else t - h - 2, np.int64)
    if order.shape[0]:
        for i in range(k if top else h):
            out[i] = order[i]
        if not top:
            for i in range(pool.shape[0]):
                pool[i] = order[h + 1 + i]
            out[k - 1] = order[t - 1]
    else:
        head_least = xs[k - 1] if top else (xs[h - 1] if h else math.inf)
        hi, lo = xs[h], xs[t - 1]
        i_head = i_pool = 0
        for i in range(n):
            v = q[i]
            if v >= head_least:
                out[i_head] = i
                i_head += 1
            elif top:
                continue
            elif lo < v < hi:
                pool[i_pool] = i
                i_pool += 1
            elif v == lo:
                out[k - 1] = i
    if t != k:
        body = k - h - 1
        for j in range(body):  # pool[:body] becomes a uniform body
            m = j + below(pool.shape[0] - j, raw, cur)
            pool[j], pool[m] = pool[m], pool[j]
            out[h + j] = pool[j]
    for j in range(k - 1, 0, -1):  # a uniform order of the set
        m = below(j + 1, raw, cur)
        out[j], out[m] = out[m], out[j]
    return out


# Raw 64-bit draws first given to a kernel: the members and their order take up to 2k − 1, the
# class a few per heap step. At k = 10, n = 500 and 20,720, a draw used 52 (median) and 81 (99th
# percentile) at ε = 1, 74 and 103 at ε = 8, so a draw rarely reruns, and a larger block would cost
# every draw its words (≈ 19 ns each from the CSPRNG). The tape holds about 20 nodes per heap step.
RAW_PER_ITEM, RAW_FOR_CLASS, TAPE = 3, 80, 2048
_NO_FORCED = np.zeros(0, np.int8)


@functools.lru_cache(maxsize=16)
def lgammas(n: int) -> npt.NDArray[np.float64]:
    """lgamma(0 … n + 1), once per catalog size (read-only: shared by every draw)."""
    table = lgamma_table(n)
    table.flags.writeable = False
    return table


_SCRATCH = threading.local()  # each thread's tape and state, reused: a draw never runs inside another


def _scratch() -> tuple[Tape, np.ndarray]:
    tape = getattr(_SCRATCH, "tape", None)
    if tape is None:
        tape = _SCRATCH.tape = Tape.of(TAPE)
        _SCRATCH.state = np.zeros(4, np.int64)
    return tape, _SCRATCH.state


def _run(
    rng: np.random.Generator,
    raw: np.ndarray,
    inputs: tuple[np.ndarray, float, np.ndarray, float, int],
    kernel: Callable[..., _T],
    args: tuple[object, ...],
) -> _T:
    """kernel(*args, raw, tape, state, forced) on the raw 64-bit draws ``raw`` (of ``rng``). The
    kernel's output is a function of the real uniforms the raw words begin; it is rerun on the
    same words (a rerun repeats the same steps) when it runs out of them (followed by fresh ones),
    fills its tape (a larger one), or meets a comparison the floats cannot decide (given the
    decision, made exactly by :mod:`recsvc.mechanisms.clm_resolve` from ``Inputs(*inputs)``)."""
    tape, state = _scratch()
    forced = _NO_FORCED
    resolver: Resolver | None = None
    while True:
        try:
            return kernel(*args, raw, tape.ops, tape.vals, state, forced)
        except OutOfRandomness:
            raw = np.concatenate((raw, rng.bit_generator.random_raw(raw.shape[0])))
        except TapeFull:
            tape = _SCRATCH.tape = Tape.of(2 * tape.ops.shape[0])
        except Undecided:
            resolver = resolver or Resolver(Inputs(*inputs), rng.bit_generator.random_raw)
            decision = resolver.less(tape, raw, int(state[PENDING_X]), int(state[PENDING_Y]))
            forced = np.append(forced, np.int8(decision))


def draw_subset(
    q: np.ndarray,
    d: np.ndarray,
    xs: np.ndarray,
    order: np.ndarray,
    k: int,
    epsilon: float,
    gamma: float,
    rng: np.random.Generator,
    *,
    slack: float = 0.0,
) -> npt.NDArray[np.int64]:
    """clm's k-subset in uniformly random order: a uniform member of the winning class. ``xs``:
    q's values sorted descending; ``order``: q's stable descending order, or empty if the scores
    are distinct (the members are then found by value). ``slack`` > 0 (tests) widens every float
    decision, sending it to the slow path."""
    raw = rng.bit_generator.random_raw(RAW_FOR_CLASS + RAW_PER_ITEM * k)
    args = (q, d, xs, order, lgammas(q.shape[0]), k, epsilon, gamma, slack)
    return _run(rng, raw, (xs, epsilon, d, gamma, k), _slate_kernel, args)
