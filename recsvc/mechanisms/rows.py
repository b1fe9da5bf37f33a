"""One selection per row of a ragged batch from ONE caller-supplied generator (the service's SelectBatch).

:func:`select_rows` makes B independent selections, row b over its own candidates (scores,
Δ, ε_b). It has the law of::

    [select(name, scores_b, sensitivities_b, epsilons[b], rng) for b in range(B)]

and, where the mechanism declares a ``rows`` sampler (rnm, pf: the exact race of every row in one
compiled pass), draws the same words in the same order as those B calls, so it returns the same
indices; only a row whose float bounds leave its race undecided (about one in 10¹⁰) draws its
further words after every row's cells. Other mechanisms run row by row through their own sample
function (still one validation up front). :func:`draw_rows` is the same draw for single-item
slates already validated (:func:`~recsvc.mechanisms.slate.valid_slates`), checking nothing again.

Unlike :func:`recsvc.mechanisms.select_batch` (seeded per-user streams, for reproducible
evaluation) this takes a Generator: the service passes its thread's CSPRNG. Privacy: each row
is the mechanism's own ε_b-DP selection on that row's ALREADY CLIPPED scores; rows share only
the generator, whose outputs are independent across rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.registry import MECHANISMS, check_params, get_mechanism
from recsvc.mechanisms.slate import ValidSlate
from recsvc.mechanisms.validation import (
    MechanismInputError,
    check_epsilon,
    check_rng,
    check_scale,
    check_scores_sensitivities,
)


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
) -> npt.NDArray[np.int64]:
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
    starts = np.concatenate(([0], np.cumsum(n)[:-1]))
    for s, k, e in zip(starts.tolist(), n.tolist(), eps.tolist(), strict=False):
        check_scale(e, q[s : s + k], d[s : s + k])  # each row's own range and Δmax, as select checks it
    gen = check_rng(rng)
    if mech.rows is not None:
        return np.asarray(mech.rows(q, d, n, eps, p, gen), dtype=np.int64)
    return np.array(
        [
            mech.sample(q[s : s + k], d[s : s + k], float(e), p, gen, 1)[0]
            for s, k, e in zip(starts.tolist(), n.tolist(), eps.tolist(), strict=False)
        ],
        dtype=np.int64,
    )


def rows_drawable(v: ValidSlate) -> bool:
    """Whether :func:`draw_rows` draws ``v`` with others: a single selection of a mechanism with a ``rows`` sampler."""
    return v.k == 1 and MECHANISMS[v.mechanism].rows is not None


def draw_rows(valid: Sequence[ValidSlate], rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """The index chosen in each of ``valid`` (single selections of ONE mechanism with a ``rows``
    sampler and the same parameters; :func:`rows_drawable`), in one pass: :func:`select_rows`'
    draw on inputs already checked."""
    first = valid[0]
    rows = MECHANISMS[first.mechanism].rows
    if rows is None or any(v.mechanism != first.mechanism or v.k != 1 or v.values != first.values for v in valid):
        raise ValueError(
            "draw_rows needs single selections of one mechanism with a rows sampler and one set of parameters"
        )
    lengths = np.fromiter((v.q.shape[0] for v in valid), np.int64, len(valid))
    epsilons = np.fromiter((v.eps_step for v in valid), np.float64, len(valid))
    return np.asarray(
        rows(
            np.concatenate([v.q for v in valid]),
            np.concatenate([v.d for v in valid]),
            lengths,
            epsilons,
            first.values,
            rng,
        ),
        dtype=np.int64,
    )
