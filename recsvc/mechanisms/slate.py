"""k-item slates, by peeling or in one pass, and their exact probabilities.

A slate is k distinct candidates in selection order. A one-shot mechanism (``top_k`` declared:
oneshot, gumbel, clm) draws the whole slate in one run at ε, and its declared map says what that
run consumes. Every other mechanism peels: k successive selections without replacement, each
with ε/k on the candidates not chosen yet. The rest of this note is about peeling.

Privacy (basic adaptive composition): for a fixed set of remaining candidates, step i is an
(ε/k)-DP selection over their scores (the mechanism's own guarantee for |q_a − q'_a| ≤ Δ_a;
whatever it derives from the set — its n, Δmax, GEM's t — is public given the set). The set is
a function of the earlier outputs only, and those outputs are released with the slate anyway,
so step i is (ε/k)-DP given the previous outputs and the whole ordered slate is k · ε/k = ε-DP.
The charge is ε (:func:`slate_split`'s composition), not ε/k: the slate audit in
tests/mechanisms/test_mechanisms_slate.py shows the slate's privacy loss exceeds ε/k in general.
Dropping the order (or any item) is post-processing and free.

Every step samples exactly as :func:`recsvc.mechanisms.select` does (the mechanism's own
sample function, one draw), but the O(n) input checks run once, before step 1: passing on the
full input implies passing on every subset: n ≥ 1, finite scores and Δ > 0 hold for subsets,
and GEM's overflow bound (max|q| + |t|·max Δ)/min Δ (checked inside each GEM step, before its
draw) can only shrink (smaller n and so |t|, smaller max|q| and max Δ, larger min Δ). So once
step 1 has drawn, later steps cannot fail, and a bad call draws nothing.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.mechanism import Mechanism
from recsvc.mechanisms.privacy import PrivacyMap, Split, Stage, pure
from recsvc.mechanisms.registry import MECHANISMS, check_params, get_mechanism, log_probabilities
from recsvc.mechanisms.validation import MechanismInputError, check_inputs, check_rng, check_rows

# Exact enumeration is for audits on tiny inputs: refuse outcome spaces beyond this size.
MAX_EXACT_OUTCOMES = 200_000

Slate = tuple[int, ...]


def check_count(name: str, value: object, least: int, most: int, what: str) -> int:
    """``value`` as an int in [least, most]; ``what`` says what ``most`` is (for the message)."""
    if type(value) is int and least <= value <= most:  # the common case, without the ABC checks
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise MechanismInputError(f"{name} must be an integer with {least} ≤ {name} ≤ {most} ({what}), got {value!r}")
    if not least <= int(value) <= most:
        raise MechanismInputError(
            f"{name} = {int(value)} is out of range; expected an integer with {least} ≤ {name} ≤ {most} ({what})"
        )
    return int(value)


@functools.lru_cache(maxsize=256)  # a Split is immutable; every slate request of the same k shares one
def slate_split(k: int, privacy_map: PrivacyMap = pure, one_shot: bool = False) -> Split:
    """A k-item slate's budget (``privacy_map``: the mechanism's): k steps of ε/k each, or for a
    one-shot mechanism one stage of one step at ε, so the charge is map(ε), not k·map(ε/k)."""
    return Split((one_shot_stage("epsilon", privacy_map) if one_shot else Stage("epsilon/k", k, privacy_map),))


def one_shot_stage(label: str, privacy_map: PrivacyMap = pure) -> Stage:
    """A stage run by ONE call of a one-shot mechanism, however many items it returns: one step
    at the stage's whole ε, consuming privacy_map(ε) once."""
    return Stage(label, 1, privacy_map)


def is_one_shot(name: str) -> bool:
    return get_mechanism(name, allow_non_private=True).one_shot


@dataclass(frozen=True)
class ValidSlate:
    """A k-item slate's inputs with every check passed, made only by :func:`valid_slate`:
    :func:`draw_slate` draws from it without checking anything again. It pickles (a service
    sends it to a draw process), so it names its mechanism rather than holding it."""

    mechanism: str  # a registered name whose non-private gate has passed
    q: np.ndarray = field(repr=False)  # float64 (n,), finite, already clipped
    d: np.ndarray = field(repr=False)  # float64 (n,), finite, > 0
    eps_step: float  # one step's ε: the whole ε for a one-shot mechanism, else ε/k
    k: int  # 1 ≤ k ≤ n
    values: Mapping[str, float]  # the mechanism's own parameters, checked and defaulted


def valid_slate(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    k: int,
    *,
    allow_non_private: bool = False,
    **params: object,
) -> ValidSlate:
    """Every check :func:`select_slate` makes except the generator's, once: ``name`` (``rnmh``
    refused unless ``allow_non_private``), ε, scores, Δ, 1 ≤ k ≤ n and ``params``. A
    :class:`MechanismInputError` names what is wrong."""
    mech = get_mechanism(name, allow_non_private)
    eps, q, d = check_inputs(epsilon, scores, sensitivities)
    return _valid(mech, eps, q, d, k, dict(check_params(params, mech)))  # a dict: a mappingproxy does not pickle


def valid_slates(
    name: str,
    scores: np.ndarray,
    sensitivities: np.ndarray,
    lengths: np.ndarray,
    epsilons: Sequence[float],
    k: int,
    *,
    allow_non_private: bool = False,
    **params: object,
) -> list[ValidSlate | MechanismInputError]:
    """:func:`valid_slate` on each row of a ragged batch (the rows' scores and Δ concatenated,
    ``lengths`` their sizes, one ε per row; the same mechanism, k and ``params``): row b's entry
    is what ``valid_slate(name, q_b, Δ_b, epsilons[b], k, **params)`` returns, or the error it
    raises. The mechanism and ``params`` are checked once (a bad one raises for every row), the
    rows' numbers in one compiled pass (:func:`~recsvc.mechanisms.validation.check_rows`)."""
    mech = get_mechanism(name, allow_non_private)
    values = dict(check_params(params, mech))
    out: list[ValidSlate | MechanismInputError] = []
    for row in check_rows(epsilons, scores, sensitivities, lengths):
        if isinstance(row, MechanismInputError):
            out.append(row)
            continue
        try:
            out.append(_valid(mech, *row, k, values))
        except MechanismInputError as exc:
            out.append(exc)
    return out


def _valid(mech: Mechanism, eps: float, q: np.ndarray, d: np.ndarray, k: int, values: dict[str, float]) -> ValidSlate:
    """The slate's own checks (1 ≤ k ≤ n, its split) on checked ε, q and Δ."""
    kk = check_count("k", k, 1, q.shape[0], "the number of candidates")
    (eps_step,) = slate_split(kk, one_shot=mech.one_shot).stage_epsilons(eps)
    return ValidSlate(mech.name, q, d, eps_step, kk, values)


def draw_slate(v: ValidSlate, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """k distinct candidate indices (int64, in selection order) from inputs already checked:
    the draw of :func:`select_slate`, with no check (a data-dependent bound inside a step, such
    as GEM's, can still refuse, and then before the first draw)."""
    return draw_steps(MECHANISMS[v.mechanism], v.q, v.d, v.eps_step, v.k, v.values, rng)


def draw_steps(
    mech: Mechanism,
    q: np.ndarray,
    d: np.ndarray,
    eps_step: float,
    k: int,
    values: Mapping[str, float],
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    """k items on checked q, Δ and parameters: one run of a one-shot mechanism at ``eps_step``
    (its stage's single step: the whole budget), else :func:`peel` at ``eps_step`` per step."""
    if mech.top_k is None:
        return peel(mech, q, d, eps_step, k, values, rng)
    return np.asarray(mech.top_k(q, d, eps_step, values, rng, k), dtype=np.int64)


def peel(
    mech: Mechanism,
    q: np.ndarray,
    d: np.ndarray,
    eps_step: float,
    k: int,
    values: Mapping[str, float],
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    """k selections without replacement at ``eps_step`` each, on checked q, Δ and parameters
    (see module doc): each step is one ``sample`` draw without repeating the O(n) input checks,
    or, for k ≥ 2, the mechanism's own ``peel_fn`` draws all k steps with the same law."""
    if mech.peel_fn is not None and k >= 2:
        return np.asarray(mech.peel_fn(q, d, eps_step, values, rng, k), dtype=np.int64)
    remaining = np.arange(q.shape[0], dtype=np.int64)
    out = np.empty(k, dtype=np.int64)
    for i in range(k):
        j = int(mech.sample(q, d, eps_step, values, rng, 1)[0])
        out[i] = remaining[j]
        if i + 1 < k:  # keep the survivors in their original order
            keep = np.arange(remaining.shape[0]) != j
            remaining, q, d = remaining[keep], q[keep], d[keep]
    return out


def native_peel_work(
    name: str, q: np.ndarray, d: np.ndarray, epsilon: float, k: int, params: dict[str, object]
) -> float | None:
    """A k-item slate's expected cost in random draws' worth when ``name`` peels it natively
    (its ``peel_work_fn`` at ε/k, O(n)); None when it does not (one draw per candidate per step)."""
    mech = get_mechanism(name, allow_non_private=True)
    return _peel_work(mech, q, d, epsilon / k, k, check_params(params, mech))


def slate_work(v: ValidSlate) -> float | None:
    """:func:`native_peel_work` of checked inputs."""
    return _peel_work(MECHANISMS[v.mechanism], v.q, v.d, v.eps_step, v.k, v.values)


def _peel_work(
    mech: Mechanism, q: np.ndarray, d: np.ndarray, eps_step: float, k: int, values: Mapping[str, float]
) -> float | None:
    if mech.peel_work_fn is None or k < 2:
        return None
    return mech.peel_work_fn(q, d, eps_step, values, k)


def select_slate(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    k: int,
    rng: np.random.Generator | None = None,
    *,
    allow_non_private: bool = False,
    **params: object,
) -> np.ndarray:
    """k distinct candidate indices (int64, in selection order) chosen with ``name``.

    A one-shot mechanism runs its own one-pass sampler once at ε (never peeled). Any other
    peels: step i runs ``select(name, ·, ε/k)`` on the candidates not chosen yet (their ALREADY
    CLIPPED scores and Δ). With k = 1 either is exactly ``select`` (same draws from the same ``rng``).

    Privacy: one-shot, the mechanism's declared map at ε; peeling, ε-DP (pure) for
    |q_a − q'_a| ≤ Δ_a by basic composition of k (ε/k)-DP selections, each (ε/k)-DP given the
    previous outputs, which are released together with it. Either way the charge is
    :func:`recsvc.mechanisms.charged_epsilon` (ε for every private built-in). ``rnmh`` (NOT DP)
    is refused unless ``allow_non_private``.

    All input (``name``, ε, scores, Δ, ``k`` with 1 ≤ k ≤ n, ``params``, ``rng``) is checked
    before any draw: bad input never moves ``rng``. It is :func:`valid_slate` (the checks, once),
    then :func:`draw_slate` (the draw, no check).
    """
    v = valid_slate(name, scores, sensitivities, epsilon, k, allow_non_private=allow_non_private, **params)
    return draw_slate(v, check_rng(rng))


def chain_log_probabilities(
    name: str, q: np.ndarray, d: np.ndarray, eps_step: float, k: int, params: dict[str, object]
) -> dict[Slate, float]:
    """log P(slate) for every ordered k-tuple, as :func:`draw_slate` draws it: a one-shot
    mechanism's own exact slate law at ``eps_step``, else the product of each peeling step's
    exact probability over the candidates still remaining (in their original order, as
    :func:`peel` keeps them)."""
    mech = get_mechanism(name, allow_non_private=True)
    if mech.one_shot:
        if mech.slate_log_probabilities_fn is None:
            raise NotImplementedError(
                f"mechanism {name!r} has no exact slate probabilities; estimate slates with select_slate"
            )
        return mech.slate_log_probabilities_fn(q, d, eps_step, check_params(params, mech), k)
    out: dict[Slate, float] = {}
    steps: dict[Slate, np.ndarray] = {}  # one exact call per remaining SET (prefixes share them)

    def walk(prefix: Slate, remaining: Slate, log_p: float) -> None:
        step = steps.get(remaining)
        if step is None:
            idx = list(remaining)
            step = steps[remaining] = log_probabilities(name, q[idx], d[idx], eps_step, **params)
        for j, a in enumerate(remaining):
            if len(prefix) + 1 == k:
                out[(*prefix, a)] = log_p + float(step[j])
            else:
                walk((*prefix, a), remaining[:j] + remaining[j + 1 :], log_p + float(step[j]))

    walk((), tuple(range(q.shape[0])), 0.0)
    return out


def require_exact(name: str) -> None:
    if not get_mechanism(name, allow_non_private=True).exact:
        raise NotImplementedError(
            f"mechanism {name!r} has no exact selection probabilities; estimate slates with select_slate"
        )


def check_outcomes(count: int, what: str) -> None:
    if count > MAX_EXACT_OUTCOMES:
        raise MechanismInputError(
            f"{what} has {count} outcomes; exact enumeration is for small inputs "
            f"(at most {MAX_EXACT_OUTCOMES}); expected a smaller n or k"
        )


def slate_log_probabilities(
    name: str, scores: object, sensitivities: object, epsilon: float, k: int, **params: object
) -> dict[Slate, float]:
    """Exact log P(select_slate returns this ordered k-tuple), for every ordered k-tuple of
    distinct indices (−inf where impossible). ``NotImplementedError`` for mechanisms without
    exact probabilities (rs, rs_improved, rnmh). For small n: n!/(n−k)! outcomes."""
    require_exact(name)
    eps, q, d = check_inputs(epsilon, scores, sensitivities)
    kk = check_count("k", k, 1, q.shape[0], "the number of candidates")
    check_outcomes(math.perm(q.shape[0], kk), "the slate")
    (eps_step,) = slate_split(kk, one_shot=is_one_shot(name)).stage_epsilons(eps)
    return chain_log_probabilities(name, q, d, eps_step, kk, params)


def slate_probabilities(
    name: str, scores: object, sensitivities: object, epsilon: float, k: int, **params: object
) -> dict[Slate, float]:
    """Exact P(slate) for every ordered k-tuple (sums to 1 up to ~1e-12); see
    :func:`slate_log_probabilities`."""
    logs = slate_log_probabilities(name, scores, sensitivities, epsilon, k, **params)
    return {s: math.exp(v) for s, v in logs.items()}
