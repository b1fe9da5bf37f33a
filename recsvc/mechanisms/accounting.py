"""The ε a selection consumes: its budget split composed with each mechanism's declared map.

This is what the service charges. A slate (:func:`recsvc.mechanisms.select_slate`) is k steps
of ε/k, or for a one-shot mechanism one step at ε (its map at ε, once); a two-stage selection
(:func:`recsvc.mechanisms.select_two_stage`) is m steps of the candidate mechanism at ε₁/m, then
k steps at (ε − ε₁)/k, each stage one step at its whole share when its mechanism is one-shot; a mechanism that declares its own
split (combined GEM's correlation bit) is composed inside each step. Every step consumes its
mechanism's ``privacy_map`` of the step's ε, and the steps add up (basic adaptive composition).
For every private built-in mechanism the charge is exactly the requested ε; it is infinite for
``rnmh``, which no finite charge covers.

The charge is the selection's privacy map d_in → d_out (:func:`selection_map`: each mechanism's
:class:`~recsvc.mechanisms.privacy.DistanceMap` with k, the split and the parameters as
arguments) at d_in = 1, the neighbours' distance; :func:`selection_split` is the same budget as
the samplers divide it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from fractions import Fraction

from recsvc.mechanisms.mechanism import Mechanism
from recsvc.mechanisms.privacy import Budget, PrivacyMap, Split
from recsvc.mechanisms.registry import check_params, get_mechanism
from recsvc.mechanisms.slate import slate_split
from recsvc.mechanisms.two_stage import two_stage_split


def _step_map(mech: Mechanism, params: Mapping[str, object]) -> PrivacyMap:
    values = check_params(params, mech)
    return lambda epsilon: mech.privacy.consumed(epsilon, values)


def selection_split(
    name: str,
    k: int = 1,
    *,
    m: int | None = None,
    candidate_fraction: float | None = None,
    candidate_mechanism: str = "rnm",
    params: Mapping[str, object] | None = None,
) -> Split:
    """The budget split of a k-item selection with mechanism ``name``: a slate, or with ``m`` and
    ``candidate_fraction`` a two-stage selection whose candidate stage runs ``candidate_mechanism``.
    ``params`` (``None`` = default) are checked as :func:`recsvc.mechanisms.select` checks them."""
    mech, cand = _stages(name, candidate_mechanism, candidate_fraction)
    given = dict(params or {})
    step = _step_map(mech, given)
    if cand is None or candidate_fraction is None:
        return slate_split(k, step, mech.one_shot)
    return two_stage_split(
        candidate_fraction,
        1 if m is None else m,
        k,
        _step_map(cand, given),
        step,
        candidate_one_shot=cand.one_shot,
        one_shot=mech.one_shot,
    )


def charged_epsilon(
    name: str,
    epsilon: float,
    k: int = 1,
    *,
    m: int | None = None,
    candidate_fraction: float | None = None,
    candidate_mechanism: str = "rnm",
    **params: object,
) -> float:
    """The ε to charge for a selection at ``epsilon`` (already checked): its privacy map
    (:func:`selection_map`) at d_in = 1, the neighbours' distance. ``math.inf`` when a mechanism
    involved is not private."""
    mech, cand = _stages(name, candidate_mechanism, candidate_fraction)
    return _charged(
        mech,
        cand,
        float(epsilon),
        k,
        m,
        candidate_fraction,
        tuple(params.items()),
    )


SelectionMap = Callable[[Budget | int, Budget | int], Budget]
"""(d_in, ε) → d_out of one whole selection (a slate, or both stages of a two-stage one)."""


def selection_map(
    name: str,
    k: int = 1,
    *,
    m: int | None = None,
    candidate_fraction: float | None = None,
    candidate_mechanism: str = "rnm",
    params: Mapping[str, object] | None = None,
) -> SelectionMap:
    """The privacy map of a k-item selection with mechanism ``name`` (a slate, or with ``m`` and
    ``candidate_fraction`` a two-stage selection): ``(d_in, ε) ↦ d_out``, the registry's maps with
    k, the split and the parameters (checked as :func:`recsvc.mechanisms.select` checks them)
    bound. Exact: a Fraction out, or ``math.inf``."""
    mech, cand = _stages(name, candidate_mechanism, candidate_fraction)
    return _selection_map(mech, cand, k, m, candidate_fraction, dict(params or {}))


def _stages(
    name: str, candidate_mechanism: str, candidate_fraction: float | None
) -> tuple[Mechanism, Mechanism | None]:
    """A selection's mechanism and its candidate stage's (None: no candidate stage)."""
    cand = get_mechanism(candidate_mechanism, allow_non_private=True) if candidate_fraction is not None else None
    return get_mechanism(name, allow_non_private=True), cand


def _selection_map(
    mech: Mechanism,
    cand: Mechanism | None,
    k: int,
    m: int | None,
    candidate_fraction: float | None,
    params: Mapping[str, object],
) -> SelectionMap:
    values = check_params(params, mech)
    if cand is None or candidate_fraction is None:
        return lambda d_in, epsilon: mech.distance_map(d_in, epsilon, k, values)
    cand_values = check_params(params, cand)
    split = two_stage_split(candidate_fraction, 1 if m is None else m, k)  # its budgets; the maps give the steps

    def two_stage(d_in: Budget | int, epsilon: Budget | int) -> Budget:
        first, second = split.exact_budgets(Fraction(epsilon))
        a = cand.distance_map(d_in, first, 1 if m is None else m, cand_values)
        b = mech.distance_map(d_in, second, k, values)
        return math.inf if math.inf in (a, b) else Fraction(a) + Fraction(b)

    return two_stage


@functools.lru_cache(maxsize=4096)  # keyed by the entries themselves: a re-registered name is a new key
def _charged(
    mech: Mechanism,
    cand: Mechanism | None,
    epsilon: float,
    k: int,
    m: int | None,
    candidate_fraction: float | None,
    params: tuple[tuple[str, object], ...],
) -> float:
    return float(_selection_map(mech, cand, k, m, candidate_fraction, dict(params))(1, epsilon))
