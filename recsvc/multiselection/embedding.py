"""The d-dimensional device side of multi-selection (docs/reference/client-bundle.md): the public
embedding of a history and its L1 clip; the noise that makes the signal local ε-DP is the lattice's
(:mod:`.lattice`).

A history h (distinct item rows of the public embedding E, n × d) embeds as

    e(h) = Σ_{i ∈ h} E[i] / √|h|        (the zero vector for an empty history)

and is clipped by scaling onto the L1 ball of the public radius R. Any two clipped embeddings are
within L1 distance 2R, which is what bounds the lattice signal's sensitivity.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError

Floats = npt.NDArray[np.float64]


def check_radius(radius: object) -> float:
    """R as a positive finite float; ParamError otherwise."""
    if isinstance(radius, bool) or not isinstance(radius, (int, float, np.floating, np.integer)):
        raise ParamError(f"radius must be a positive finite number; got {type(radius).__name__}")
    r = float(radius)
    if not np.isfinite(r) or r <= 0:
        raise ParamError(f"radius must be a positive finite number; got {r!r}")
    return r


def embed(rows: npt.ArrayLike, factors: Floats) -> Floats:
    """e(h) for the distinct item rows ``rows`` of ``factors`` (n × d), unclipped."""
    r = np.unique(np.asarray(rows, dtype=np.int64))
    if r.size == 0:
        return np.zeros(factors.shape[1], dtype=np.float64)
    # Sums in row order, one float64 addition at a time (cumsum is sequential): the spec's order, so
    # a device in another language rounds to the same lattice point.
    return np.asarray(np.cumsum(factors[r], axis=0)[-1] / np.sqrt(r.size), dtype=np.float64)


def clip_l1(embedding: npt.ArrayLike, radius: float) -> Floats:
    """``embedding`` scaled onto the L1 ball of radius R (unchanged inside it). Works row-wise on
    a 2-D array of embeddings."""
    e = np.asarray(embedding, dtype=np.float64)
    r = check_radius(radius)
    norm = (
        np.cumsum(np.abs(e), axis=-1)[..., -1:] if e.shape[-1] else np.zeros((*e.shape[:-1], 1))
    )  # sequential, as embed
    return np.asarray(e * np.minimum(1.0, r / np.maximum(norm, np.finfo(np.float64).tiny)), dtype=np.float64)
