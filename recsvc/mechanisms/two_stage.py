"""Two-stage selection over a full catalog: a private top-m candidate stage, then a slate
among those m.

Stage 1 spends ε₁ = candidate_fraction · ε on a private top-m: a slate of m items with
``candidate_mechanism`` (peeling at ε₁/m per step, or one run at ε₁ of a one-shot mechanism).
Stage 2 spends ε₂ = ε − ε₁ on a k-item slate with ``name`` among the m candidates (likewise
ε₂/k per step or one run at ε₂), in ascending catalog order, so stage 2 sees only the candidate
SET. Only the stage-2 slate is returned.

Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a over the whole catalog. Stage 1 is ε₁-DP (a peeling
slate), stage 2 is ε₂-DP for any fixed candidate set, and the set is stage 1's output, so by
basic adaptive composition the pair (candidates, slate) is ε₁ + ε₂ = ε-DP, and the returned
slate is post-processing of that pair. Charge ε in total (:func:`two_stage_split`'s composition). Nothing about the candidates is
conditional on private data outside this accounting (contrast a non-private top-m pre-filter,
which makes every item outside it probability 0 and is not end-to-end DP).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.privacy import PrivacyMap, Split, Stage, pure
from recsvc.mechanisms.registry import MECHANISMS, check_params, get_mechanism
from recsvc.mechanisms.slate import (
    Slate,
    ValidSlate,
    chain_log_probabilities,
    check_count,
    check_outcomes,
    draw_slate,
    draw_steps,
    is_one_shot,
    one_shot_stage,
    require_exact,
)
from recsvc.mechanisms.validation import MechanismInputError, check_inputs, check_rng


def check_fraction(candidate_fraction: object) -> float:
    """``candidate_fraction`` as a float in the open interval (0, 1)."""
    if isinstance(candidate_fraction, bool) or not isinstance(candidate_fraction, numbers.Real):
        raise MechanismInputError(f"candidate_fraction must be a real number in (0, 1), got {candidate_fraction!r}")
    f = float(candidate_fraction)
    if not 0.0 < f < 1.0:
        raise MechanismInputError(
            f"candidate_fraction must be in the open interval (0, 1) (the share of epsilon spent on the "
            f"private candidate stage), got {f!r}"
        )
    return f


def two_stage_split(
    candidate_fraction: object,
    m: int = 1,
    k: int = 1,
    candidate_map: PrivacyMap = pure,
    privacy_map: PrivacyMap = pure,
    *,
    m_label: str = "m",
    candidate_one_shot: bool = False,
    one_shot: bool = False,
) -> Split:
    """The two stages' budget: m steps of ε₁/m (ε₁ = candidate_fraction·ε) with the candidate
    mechanism (``candidate_map``), then k steps of (ε − ε₁)/k with the selecting one
    (``privacy_map``); a one-shot mechanism's stage is one step at its whole share instead.
    ``m_label`` names m in refusals (the service calls it num_candidates)."""
    f = check_fraction(candidate_fraction)
    first = (
        one_shot_stage("candidate_fraction·epsilon", candidate_map)
        if candidate_one_shot
        else Stage(f"candidate_fraction·epsilon/{m_label}", m, candidate_map)
    )
    second = (
        one_shot_stage("(1 − candidate_fraction)·epsilon", privacy_map)
        if one_shot
        else Stage("(1 − candidate_fraction)·epsilon/k", k, privacy_map)
    )
    return Split(
        (first, second),
        (f,),
        "candidate_fraction",
    )


def _checked(
    name: str,
    candidate_mechanism: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    m: int,
    candidate_fraction: float,
    k: int,
    allow_non_private: bool,
) -> tuple[np.ndarray, np.ndarray, int, int, float, float]:
    """Validated (q, Δ, m, k, ε₁/m, ε₂/k) — every check that needs no mechanism parameters."""
    get_mechanism(name, allow_non_private)
    get_mechanism(candidate_mechanism, allow_non_private)
    eps, q, d = check_inputs(epsilon, scores, sensitivities)
    mm = check_count("m", m, 1, q.shape[0], "the number of candidates in the catalog")
    kk = check_count("k", k, 1, mm, "m, the number of private candidates")
    split = two_stage_split(
        candidate_fraction, mm, kk, candidate_one_shot=is_one_shot(candidate_mechanism), one_shot=is_one_shot(name)
    )
    eps1_step, eps2_step = split.stage_epsilons(eps)
    return q, d, mm, kk, eps1_step, eps2_step


@dataclass(frozen=True)
class ValidTwoStage:
    """A two-stage selection's inputs with every check passed, made only by
    :func:`valid_two_stage`: :func:`draw_two_stage` draws from it without checking again."""

    candidates: ValidSlate  # stage 1: the candidate mechanism's m-item slate over the catalog
    mechanism: str  # stage 2's, a registered name whose non-private gate has passed
    eps_step: float  # one stage-2 step's ε
    k: int  # 1 ≤ k ≤ m
    values: Mapping[str, float]  # stage 2's own parameters, checked and defaulted


def valid_two_stage(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    m: int,
    candidate_fraction: float,
    k: int = 1,
    candidate_mechanism: str = "rnm",
    *,
    allow_non_private: bool = False,
    **params: object,
) -> ValidTwoStage:
    """Every check :func:`select_two_stage` makes except the generator's, once. Stage 2's
    data-dependent checks (those inside a mechanism's step, such as GEM's overflow bound) run as
    one discarded step on the full catalog with a throwaway generator: passing on the catalog
    implies passing on any subset (see ``slate.py``); it costs one extra step over n and
    releases nothing."""
    q, d, mm, kk, eps1_step, eps2_step = _checked(
        name, candidate_mechanism, scores, sensitivities, epsilon, m, candidate_fraction, k, allow_non_private
    )
    mech = get_mechanism(name, allow_non_private)
    cand = get_mechanism(candidate_mechanism, allow_non_private)
    values = dict(check_params(params, mech))  # dicts: a mappingproxy does not pickle
    cand_values = dict(check_params(params, cand))
    mech.sample(q, d, eps2_step, values, np.random.Generator(np.random.PCG64(0)), 1)  # checks only
    return ValidTwoStage(ValidSlate(candidate_mechanism, q, d, eps1_step, mm, cand_values), name, eps2_step, kk, values)


def draw_two_stage(v: ValidTwoStage, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """The k-item slate (catalog indices, in selection order) of :func:`select_two_stage` from
    inputs already checked, with no check."""
    c = v.candidates
    candidates = np.sort(draw_slate(c, rng))
    picked = draw_steps(MECHANISMS[v.mechanism], c.q[candidates], c.d[candidates], v.eps_step, v.k, v.values, rng)
    return candidates[picked]


def select_two_stage(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    m: int,
    candidate_fraction: float,
    k: int = 1,
    rng: np.random.Generator | None = None,
    candidate_mechanism: str = "rnm",
    *,
    allow_non_private: bool = False,
    **params: object,
) -> npt.NDArray[np.int64]:
    """A k-item slate (int64 catalog indices, in selection order) from a private top-m.

    Stage 1: ``select_slate(candidate_mechanism, q, Δ, ε₁, m)`` with ε₁ = candidate_fraction·ε
    (a one-shot mechanism runs once at ε₁, as in ``select_slate``).
    Stage 2: ``select_slate(name, q[C], Δ[C], ε − ε₁, k)`` on the candidates C in catalog order.
    ``params`` go to both stages (each mechanism uses the ones it takes).

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a, by basic composition of the ε₁-DP candidate
    stage and the (ε − ε₁)-DP selection; the charge is ε in total.

    Everything (both names, ε, scores, Δ, 1 ≤ m ≤ n, 1 ≤ k ≤ m, candidate_fraction in (0, 1),
    ``params``, ``rng``) is checked before any draw from ``rng``: it is :func:`valid_two_stage`
    (the checks, once), then :func:`draw_two_stage` (the draw, no check).
    """
    v = valid_two_stage(
        name,
        scores,
        sensitivities,
        epsilon,
        m,
        candidate_fraction,
        k,
        candidate_mechanism,
        allow_non_private=allow_non_private,
        **params,
    )
    return draw_two_stage(v, check_rng(rng))


def two_stage_log_probabilities(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    m: int,
    candidate_fraction: float,
    k: int = 1,
    candidate_mechanism: str = "rnm",
    **params: object,
) -> dict[Slate, float]:
    """Exact log P(select_two_stage returns this ordered k-tuple), for every ordered k-tuple.

    Enumerates stage 1's ordered m-tuples (summed per candidate set) and stage 2's slates in each
    set. ``NotImplementedError`` unless both mechanisms have exact probabilities. Small n only.
    """
    from scipy.special import logsumexp  # imported on use: serving starts 0.35 s sooner

    require_exact(name)
    require_exact(candidate_mechanism)
    q, d, mm, kk, eps1_step, eps2_step = _checked(
        name, candidate_mechanism, scores, sensitivities, epsilon, m, candidate_fraction, k, True
    )
    n = q.shape[0]
    check_outcomes(math.perm(n, mm) + math.comb(n, mm) * math.perm(mm, kk), "the two-stage enumeration")
    by_set: dict[Slate, list[float]] = {}
    for order, lp in chain_log_probabilities(candidate_mechanism, q, d, eps1_step, mm, params).items():
        by_set.setdefault(tuple(sorted(order)), []).append(lp)
    terms: dict[Slate, list[float]] = {}
    for cand, lps in by_set.items():
        log_p_set = float(logsumexp(lps))
        c = np.array(cand)
        for local, lp in chain_log_probabilities(name, q[c], d[c], eps2_step, kk, params).items():
            terms.setdefault(tuple(cand[i] for i in local), []).append(log_p_set + lp)
    return {s: float(logsumexp(v)) for s, v in sorted(terms.items())}


def two_stage_probabilities(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    m: int,
    candidate_fraction: float,
    k: int = 1,
    candidate_mechanism: str = "rnm",
    **params: object,
) -> dict[Slate, float]:
    """Exact P(slate) of :func:`select_two_stage`; see :func:`two_stage_log_probabilities`."""
    logs = two_stage_log_probabilities(
        name, scores, sensitivities, epsilon, m, candidate_fraction, k, candidate_mechanism, **params
    )
    return {s: math.exp(v) for s, v in logs.items()}
