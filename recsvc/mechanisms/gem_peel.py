"""GEM and mGEM slates peeled natively: k exact steps sharing one upper hull.

Each step is one ``gem``/``mgem`` selection at ε/k on the candidates not chosen yet (t from
their count m, as :func:`recsvc.mechanisms.gem.gem_t`), so the slate's law and its privacy are
those of :func:`recsvc.mechanisms.slate.peel`. Each step is sampled exactly, as ``gem`` samples
one selection: the exponential race on the real q' (:class:`recsvc.mechanisms.gem.GemUtilities`,
:mod:`recsvc.mechanisms.exact_race`), its uniforms revealed a byte at a time so that only the
candidates that may win get a full cell (:mod:`recsvc.mechanisms.gem_peel_race`: all k steps in
one compiled pass, the rare undecided step in exact_race's decimal slow path).

**One hull per slate.** The upper hull of the points (−Δ, s = q − tΔ) has the same vertices for
every t (a change of t is a shear), removing a point that is not a vertex leaves it as it was,
and removing an inner vertex only changes the stretch between its two neighbours, so the peel
builds it once, patches that stretch after an inner vertex wins and builds it again only after
an end wins. The hull only gives the
float upper bounds of q' (each a genuine term of its min); the exact decision never trusts it,
so a stale or rounded hull costs speed, never the law.

The tests hold the slates to their exact peeled law (``slate_log_probabilities``).
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms import gem, gem_peel_race
from recsvc.mechanisms.exact_race import exponential_slow_argmax
from recsvc.mechanisms.exact_sampling import uniform_words
from recsvc.mechanisms.params import ParamValues

# A step's O(m) passes (the bytes' bounds, then the lower bound of the leader) cost about a
# fifth of one ChaCha20 uniform per candidate on top of the m/8 words of the bytes.
PASS_COST = 0.2
BYTE_WORDS = 1.0 / 8.0  # words per candidate and step: one byte each
_BEHIND = -1.7e308  # a float value certainly behind: a candidate outside C


def byte_word_starts(n: int, k: int) -> list[int]:
    """Where each step's words of bytes start, and their end: m/8 words a step, rounded up (none
    for m = 1: no draw)."""
    return list(itertools.accumulate(((m + 7) // 8 if m >= 2 else 0 for m in range(n, n - k, -1)), initial=0))


def pool_size(n: int, k: int) -> int:
    """The words drawn for C up front: the zero bytes' share and 8 a step (more on demand)."""
    return k * (n // 256 + 8)


def _decide(
    q: np.ndarray,
    d: np.ndarray,
    t: float,
    eps_step: float,
    cand: np.ndarray,
    xs: np.ndarray,
    lead: float,
    rng: np.random.Generator,
) -> int:
    """An undecided step in decimal on the same cells: C's cells and float values, the rest behind."""
    a = gem.GemUtilities(q, d, eps_step, t)
    x = np.zeros(q.shape[0])
    x[cand] = xs
    v = np.full(q.shape[0], _BEHIND)
    with np.errstate(divide="ignore"):
        v[cand] = a.value[cand] - np.log(xs)
    return exponential_slow_argmax(a, x, v, lead, rng)


def _peel(
    q: np.ndarray, d: np.ndarray, sign: float, eps_step: float, beta: float, k: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    n = q.shape[0]
    ts = np.array([sign * gem.gem_t(n - i, eps_step, beta) for i in range(k)])
    starts = byte_word_starts(n, k)
    words = uniform_words(rng, starts[-1] + pool_size(n, k))
    bytes_, pool = words[: starts[-1]].view(np.uint8), words[starts[-1] :]  # step i's bytes at 8·starts[i]
    bases = np.array(starts[:-1], dtype=np.int64)
    r_full = float(np.abs(q).max()) / float(d.min())  # ≥ every survivor set's max|q|/min Δ
    qq, dd, alive = q.copy(), d.copy(), np.arange(n, dtype=np.int64)
    out = np.empty(k, np.int64)
    cand, xs = np.empty(n, np.int64), np.empty(n)
    vertices, known = np.empty(0, np.int64), False
    step, pos, winner = 0, 0, -1
    up, low = gem_peel_race.UP, gem_peel_race.LOW
    while True:
        status, step, pos, vertices, known, c, lead = gem_peel_race.peel_pass(
            qq,
            dd,
            alive,
            out,
            ts,
            eps_step,
            r_full,
            bytes_,
            bases,
            pool,
            pos,
            step,
            winner,
            vertices,
            known,
            up,
            low,
            cand,
            xs,
        )
        winner = -1
        if status == gem_peel_race.DONE:
            return out
        if status == gem_peel_race.NEED:  # unread words may be dropped: nothing has seen them
            pool, pos = np.concatenate((pool[pos:], uniform_words(rng, max(c, pool.shape[0])))), 0
        else:
            m = n - step
            winner = _decide(qq[:m].copy(), dd[:m].copy(), ts[step], eps_step, cand[:c], xs[:c], lead, rng)


def peel_work(q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, k: int) -> float:
    """:func:`gem_peel`'s and :func:`mgem_peel`'s expected work in random draws' worth: m/8 words
    and the passes a step."""
    return float(k * q.shape[0] * (BYTE_WORDS + PASS_COST))


def _peel_family(
    sign: float, q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, rng: np.random.Generator, k: int
) -> npt.NDArray[np.int64]:
    # The O(n) overflow check at the full n covers every later step: t shrinks with m (slate.py).
    gem.checked_t(q, d, eps_step, p["beta"])
    q = np.ascontiguousarray(q, dtype=np.float64)
    d = np.ascontiguousarray(d, dtype=np.float64)
    return _peel(q, d, sign, float(eps_step), float(p["beta"]), int(k), rng)


def gem_peel(
    q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, rng: np.random.Generator, k: int
) -> npt.NDArray[np.int64]:
    """k peeled ``gem`` selections at ``eps_step`` each, on validated q, Δ (module docstring)."""
    return _peel_family(1.0, q, d, eps_step, p, rng, k)


def mgem_peel(
    q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, rng: np.random.Generator, k: int
) -> npt.NDArray[np.int64]:
    """k peeled ``mgem`` selections at ``eps_step`` each, on validated q, Δ (module docstring)."""
    return _peel_family(-1.0, q, d, eps_step, p, rng, k)
