"""One selection per row of a ragged batch from ONE caller-supplied generator (the service's SelectBatch).

:func:`select_rows` makes B independent selections, row b over its own candidates (scores,
Δ, ε_b), in the order b = 0, 1, …. It is exactly equivalent to::

    [select(name, scores_b, sensitivities_b, epsilons[b], rng) for b in range(B)]

with the same ``rng``: the same indices, and ``rng`` left in the same state. For the
noise-matrix mechanisms (none at present: see :data:`VECTORISED`) each row's per-candidate noise is
drawn in candidate order, row after row, so ONE call drawing all N = Σ n_b values consumes the
stream exactly as the B calls do, and one argmax per row replaces B Python-level calls. Other
mechanisms run row by row through their own sample function (still one validation up front).

Unlike :func:`recsvc.mechanisms.select_batch` (seeded per-user streams, for reproducible
evaluation) this takes a Generator: the service passes its thread's CSPRNG. Privacy: each row
is the mechanism's own ε_b-DP selection on that row's ALREADY CLIPPED scores; rows share only
the generator, whose outputs are independent across rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.registry import check_params, get_mechanism
from recsvc.mechanisms.validation import (
    MechanismInputError,
    check_epsilon,
    check_rng,
    check_scale,
    check_scores_sensitivities,
)

# name → (draw N noise values, pick per row): argmax(u + noise) for each of them
_Noise = Callable[[np.random.Generator, int], np.ndarray]
# Empty: rnm, pf and rnm_laplace sample by the exact race (recsvc.mechanisms.exact_race), whose
# draws are not a float noise matrix, so their rows run one select each (same law, same stream).
VECTORISED: dict[str, tuple[_Noise, str]] = {}


def check_lengths(lengths: object, total: int) -> np.ndarray:
    out = np.asarray(lengths)
    if out.ndim != 1 or out.size == 0 or out.dtype.kind not in "iu" or (out < 1).any() or int(out.sum()) != total:
        raise MechanismInputError(
            f"lengths must be a non-empty 1-D integer array of row sizes >= 1 summing to the {total} scores"
        )
    return out.astype(np.int64)


def select_rows(
    name: str,
    scores: object,
    sensitivities: object,
    lengths: object,
    epsilons: object,
    rng: np.random.Generator | None = None,
    *,
    allow_non_private: bool = False,
    **params: object,
) -> np.ndarray:
    """Index (within its row) chosen for each row: int64 (B,). ``scores``/``sensitivities`` are
    the rows' ALREADY CLIPPED values concatenated (N,), ``lengths`` (B,) the row sizes,
    ``epsilons`` (B,) each row's ε. All input is checked before any draw."""
    mech = get_mechanism(name, allow_non_private)
    p = check_params(params, mech)
    q, d = check_scores_sensitivities(scores, sensitivities)
    n = check_lengths(lengths, q.shape[0])
    eps = np.asarray(epsilons, dtype=np.float64)
    if eps.shape != n.shape:
        raise MechanismInputError(f"epsilons has shape {eps.shape}; expected one ε per row, shape {n.shape}")
    for e in eps.tolist():  # the scalar check's message, for the first bad one
        check_epsilon(e)
    if eps.size:
        check_scale(float(eps.max()), q, d)
    gen = check_rng(rng)
    vec = VECTORISED.get(name)
    starts = np.concatenate(([0], np.cumsum(n)[:-1]))
    if vec is None:
        return np.array(
            [
                mech.sample(q[s : s + k], d[s : s + k], float(e), p, gen, 1)[0]
                for s, k, e in zip(starts.tolist(), n.tolist(), eps.tolist(), strict=False)
            ],
            dtype=np.int64,
        )
    draw, pick = vec
    row = np.repeat(np.arange(n.size), n)
    # u = (q − max q)·ε/(2Δmax) per row, computed with the same operations as noisy_max._rnm_u.
    u = (q - np.maximum.reduceat(q, starts)[row]) * (eps / (2.0 * np.maximum.reduceat(d, starts)))[row]
    z = draw(gen, q.shape[0])
    z += u
    return _arg_per_row(z, n, starts, row, pick == "max")


def _arg_per_row(
    z: np.ndarray, n: np.ndarray, starts: np.ndarray, row: np.ndarray, largest: bool
) -> npt.NDArray[np.int64]:
    """argmax (or argmin) of each row of the ragged z; the lowest index wins a tie, as in the per-row call."""
    if (n == n[0]).all():  # the common case: every row has the same size
        m = z.reshape(n.size, int(n[0]))
    else:
        m = np.full((n.size, int(n.max())), -np.inf if largest else np.inf)
        m[row, np.arange(z.shape[0]) - starts[row]] = z
    picked = cast("npt.NDArray[np.intp]", m.argmax(axis=1) if largest else m.argmin(axis=1))  # numpy: Any
    return picked.astype(np.int64)
