"""The registry of selection mechanisms and the public API (SPEC §2).

Every entry point validates ALL input (``validation.py``) before drawing any randomness, so bad
input never selects anything and never moves the caller's generator. Scores must ALREADY be
clipped to each item's [lo, hi] (callers own the ranges; clipping is what makes Δ a bound).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from recsvc.mechanisms import gem, noisy_max, random_stopping, randomized_response
from recsvc.mechanisms.validation import (
    MechanismInputError,
    Params,
    check_batch,
    check_epsilon,
    check_params,
    check_scores_sensitivities,
    check_seed,
    check_trials,
    check_user_offset,
)
from recsvc.rng import thread_csprng, user_stream

SampleFn = Callable[[np.ndarray, np.ndarray, float, Params, np.random.Generator, int], np.ndarray]
LogProbFn = Callable[[np.ndarray, np.ndarray, float, Params], np.ndarray]


class NonPrivateMechanismError(MechanismInputError):
    """A non-DP mechanism (``rnmh``) was requested where privacy is required."""


@dataclass(frozen=True)
class Mechanism:
    """One selection mechanism. ``private`` is False only for ``rnmh``; ``exact`` says whether
    :func:`probabilities` has an exact form."""

    name: str
    private: bool
    exact: bool
    description: str
    sample: SampleFn = field(repr=False, compare=False)
    log_probabilities_fn: LogProbFn | None = field(default=None, repr=False, compare=False)

    @property
    def privacy(self) -> str:
        return "ε-DP" if self.private else "NOT DP"


def _m(name: str, description: str, sample: SampleFn, log_p: LogProbFn | None, private: bool = True) -> Mechanism:
    return Mechanism(name, private, log_p is not None, description, sample, log_p)


MECHANISMS: Mapping[str, Mechanism] = MappingProxyType(
    {
        m.name: m
        for m in (
            _m("rnm", "report noisy max, Exponential noise of mean 2Δmax/ε", noisy_max.rnm_sample, noisy_max.rnm_log_probabilities),
            _m("rnm_laplace", "report noisy max, Laplace noise of scale 2Δmax/ε", noisy_max.rnm_laplace_sample, noisy_max.rnm_laplace_log_probabilities),
            _m("em", "exponential mechanism, P(a) ∝ exp(ε q_a / 2Δmax)", noisy_max.em_sample, noisy_max.em_log_probabilities),
            _m("pf", "permute-and-flip (same distribution as rnm)", noisy_max.pf_sample, noisy_max.rnm_log_probabilities),
            _m("krr", "k-ary randomised response on the argmax", randomized_response.krr_sample, randomized_response.krr_log_probabilities),
            _m("random", "uniform over the candidates (baseline)", randomized_response.random_sample, randomized_response.random_log_probabilities),
            _m("rnmh", "report noisy max, Exponential noise of mean 2Δ_a/ε (reference only)", noisy_max.rnmh_sample, None, private=False),
            _m("rs", "Liu–Talwar random stopping, Laplace(3Δ_a/ε), stop w.p. γ", random_stopping.rs_sample, None),
            _m("rs_improved", "Papernot–Steinke stopping (η=0), K ~ Logarithmic(1−γ), Laplace(2Δ_a/ε)", random_stopping.rs_improved_sample, None),
            _m("gem", "generalised exponential mechanism, t = 2 ln(n/β)/ε, rnm on q'", gem.gem_sample, gem.gem_log_probabilities),
            _m("mgem", "modified GEM, t = −2 ln(n/β)/ε, rnm on q'", gem.mgem_sample, gem.mgem_log_probabilities),
            _m("combined_gem", "RR (ε_c = cε) on sign of spearman(q, Δ), then mgem/gem with ε − ε_c", gem.combined_gem_sample, gem.combined_gem_log_probabilities),
        )
    }
)


def get_mechanism(name: object, allow_non_private: bool = False) -> Mechanism:
    """Look up a mechanism by name. Raises ``ValueError`` for an unknown name, and
    :class:`NonPrivateMechanismError` for ``rnmh`` unless ``allow_non_private`` is True."""
    mech = MECHANISMS.get(name) if isinstance(name, str) else None
    if mech is None:
        raise MechanismInputError(f"unknown mechanism {name!r}; expected one of {', '.join(MECHANISMS)}")
    if not mech.private and not allow_non_private:
        raise NonPrivateMechanismError(
            f"mechanism {name!r} is NOT differentially private (paper §IV-A) and is refused where privacy "
            f"is required; use a private mechanism ({', '.join(n for n, m in MECHANISMS.items() if m.private)}) "
            f"or pass allow_non_private=True for reference runs"
        )
    return mech


def select(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    rng: np.random.Generator | None = None,
    *,
    allow_non_private: bool = False,
    **params: object,
) -> int:
    """Index of the candidate chosen by mechanism ``name`` on ALREADY CLIPPED ``scores``.

    ``rng`` defaults to this thread's CSPRNG (``recsvc.rng.thread_csprng``). ``params``: ``beta``,
    ``gamma``, ``corr_budget_fraction`` (``None`` = default). All input is validated before any
    draw; ``rnmh`` raises unless ``allow_non_private=True``.
    """
    mech = get_mechanism(name, allow_non_private)
    p = check_params(params)
    eps = check_epsilon(epsilon)
    q, d = check_scores_sensitivities(scores, sensitivities)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise MechanismInputError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
    return int(mech.sample(q, d, eps, p, rng if rng is not None else thread_csprng(), 1)[0])


def select_batch(
    name: str,
    scores: object,
    sensitivities: object,
    epsilon: float,
    trials: int,
    seed: int,
    *,
    user_offset: int = 0,
    allow_non_private: bool = False,
    **params: object,
) -> np.ndarray:
    """``trials`` independent selections for each of B users: int64 array (B, trials).

    ``scores`` (B, n) ALREADY CLIPPED; ``sensitivities`` (B, n) or shared (n,). Row b uses the
    stream ``recsvc.rng.user_stream(seed, user_offset + b)`` (SeedSequence(seed, spawn_key=(user,))),
    so a chunk of users starting at global index ``user_offset`` gives the same rows as one big call.
    """
    mech = get_mechanism(name, allow_non_private)
    p = check_params(params)
    eps = check_epsilon(epsilon)
    k = check_trials(trials)
    s = check_seed(seed)
    off = check_user_offset(user_offset)
    q, d = check_batch(scores, sensitivities)
    out = np.empty((q.shape[0], k), dtype=np.int64)
    for b in range(q.shape[0]):
        out[b] = mech.sample(q[b], d[b], eps, p, user_stream(s, off + b), k)
    return out


def log_probabilities(name: str, scores: object, sensitivities: object, epsilon: float, **params: object) -> np.ndarray:
    """Exact log P(output = a), shape (n,); ``NotImplementedError`` where no exact form exists."""
    mech = get_mechanism(name, allow_non_private=True)
    if mech.log_probabilities_fn is None:
        raise NotImplementedError(
            f"mechanism {name!r} has no exact selection probabilities; estimate them with select_batch"
        )
    p = check_params(params)
    eps = check_epsilon(epsilon)
    q, d = check_scores_sensitivities(scores, sensitivities)
    return mech.log_probabilities_fn(q, d, eps, p)


def probabilities(name: str, scores: object, sensitivities: object, epsilon: float, **params: object) -> np.ndarray:
    """Exact P(output = a), shape (n,) (sums to 1 up to ~1e-12). ``NotImplementedError`` for
    ``rs``, ``rs_improved`` and ``rnmh``."""
    return np.exp(log_probabilities(name, scores, sensitivities, epsilon, **params))
