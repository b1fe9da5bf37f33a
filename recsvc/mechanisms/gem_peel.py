"""GEM and mGEM slates peeled natively: k exact steps sharing one upper hull.

Each step is one ``gem``/``mgem`` selection at ε/k on the candidates not chosen yet (t from
their count m, as :func:`recsvc.mechanisms.gem.gem_t`), so the slate's law and its privacy are
those of :func:`recsvc.mechanisms.slate.peel`. Each step is sampled exactly, as ``gem`` samples
one selection: the exponential race on the real q' (:class:`recsvc.mechanisms.gem.GemUtilities`,
:mod:`recsvc.mechanisms.exact_race`), m uniforms and one compiled pass.

**One hull per slate.** The upper hull of the points (−Δ, s = q − tΔ) has the same vertices for
every t (a change of t is a shear), and removing a point that is not a vertex leaves it as it
was, so the peel builds it once and again only after a vertex wins. The hull only gives the
float upper bounds of q' (each a genuine term of its min); the exact decision never trusts it,
so a stale or rounded hull costs speed, never the law.

The tests hold the slates to their exact peeled law (``slate_log_probabilities``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms import gem
from recsvc.mechanisms.exact_race import EXPONENTIAL, race_argmax
from recsvc.mechanisms.params import ParamValues

# A step's two O(m) passes (the hull's tangents and the race) cost about a fifth of one ChaCha20
# uniform per candidate on top of the m uniforms the race draws.
PASS_COST = 0.2


def _peel(
    q: np.ndarray, d: np.ndarray, sign: float, eps_step: float, beta: float, k: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    alive = np.arange(q.shape[0])  # the survivors, in their original order
    out = np.empty(k, np.int64)
    vertices = gem.hull_vertices(np.ascontiguousarray(q - sign * gem.gem_t(q.shape[0], eps_step, beta) * d), d)
    for i in range(k):
        qq, dd = q[alive], d[alive]
        t = sign * gem.gem_t(alive.shape[0], eps_step, beta)
        s = np.ascontiguousarray(qq - t * dd)
        hx, hy, edge = gem.hull_at(s, dd, vertices)
        qp = gem.tangents(hx, hy, edge, dd, s)
        w = int(race_argmax(gem.GemUtilities(qq, dd, eps_step, t, s=s, qp=qp), EXPONENTIAL, rng, 1)[0])
        out[i] = alive[w]
        alive = np.delete(alive, w)
        if w in vertices:  # a vertex won: the hull of the rest is built again
            vertices = gem.hull_vertices(np.ascontiguousarray(s[np.arange(s.shape[0]) != w]), np.delete(dd, w))
        else:
            vertices = vertices - (vertices > w)
    return out


def _work_family(sign: float, q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, k: int) -> float:
    return float(k * q.shape[0] * (1.0 + PASS_COST))


def gem_peel_work(q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, k: int) -> float:
    """:func:`gem_peel`'s expected work in random draws' worth: m uniforms and two passes a step."""
    return _work_family(1.0, q, d, eps_step, p, k)


def mgem_peel_work(q: np.ndarray, d: np.ndarray, eps_step: float, p: ParamValues, k: int) -> float:
    """:func:`mgem_peel`'s expected work in random draws' worth: m uniforms and two passes a step."""
    return _work_family(-1.0, q, d, eps_step, p, k)


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
