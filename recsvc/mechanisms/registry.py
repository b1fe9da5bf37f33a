"""The registry of selection mechanisms and the public API (docs/reference/specification.md §2).

Each entry declares its privacy (:class:`recsvc.mechanisms.privacy.Privacy`: map, neighbouring
relation, audit, proof); docs/concepts/mechanisms.md is generated from the entries.
Every entry point validates ALL input (``validation.py``) before drawing any randomness, so bad
input never selects anything and never moves the caller's generator. Scores must ALREADY be
clipped to each item's [lo, hi] (callers own the ranges; clipping is what makes Δ a bound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, KeysView, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms import gem, noisy_max, random_stopping, randomized_response
from recsvc.mechanisms.params import ParamSpec, ParamValues, param_specs
from recsvc.mechanisms.privacy import (
    PROOFS,
    Audit,
    AuditKind,
    Neighbouring,
    Privacy,
    PrivacyMap,
    Split,
    not_private,
    pure,
)
from recsvc.mechanisms.validation import (
    MechanismInputError,
    check_batch,
    check_epsilon,
    check_rng,
    check_scores_sensitivities,
    check_seed,
    check_trials,
    check_user_offset,
)
from recsvc.rng import user_stream

# sample(q, Δ, ε, own params, rng, size) -> (size,) int64 indices; log_p(q, Δ, ε, own params) -> (n,)
SampleFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, np.random.Generator, int], np.ndarray]
LogProbFn = Callable[[np.ndarray, np.ndarray, float, ParamValues], np.ndarray]
# expectation(q, Δ, ε, own params, values ≥ 0) -> E[values[output]], exactly and cheaply
ExpectationFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, np.ndarray], float]

# The keyword arguments of select/select_batch: a parameter named like one could never be passed.
_RESERVED = frozenset(
    {
        "name",
        "scores",
        "sensitivities",
        "epsilon",
        "rng",
        "trials",
        "seed",
        "user_offset",
        "allow_non_private",
        "k",
        "m",
        "candidate_fraction",
        "candidate_mechanism",
    }
)


class NonPrivateMechanismError(MechanismInputError):
    """A non-DP mechanism (``rnmh``) was requested where privacy is required."""


@dataclass(frozen=True)
class Mechanism:
    """One selection mechanism. ``privacy`` declares what it promises and how that is proven
    (``private`` is False only for ``rnmh``, whose map is infinite); it is ``exact`` when it
    has ``log_probabilities_fn``; ``params`` maps each parameter it takes to its spec;
    ``expectation_fn`` (exact mechanisms only) is a cheap exact E[values[output]], declared where
    one exists: the `auto` policy table needs millions of expected errors (rnm_laplace has none,
    its exact probabilities cost ~40 ms at n = 500)."""

    name: str
    description: str  # one line
    sample: SampleFn = field(repr=False, compare=False)
    log_probabilities_fn: LogProbFn | None = field(default=None, repr=False, compare=False)
    params: Mapping[str, ParamSpec] = field(default_factory=param_specs, compare=False)
    expectation_fn: ExpectationFn | None = field(default=None, repr=False, compare=False)
    privacy: Privacy = field(kw_only=True)

    def __post_init__(self) -> None:
        if not self.name or not self.description or "\n" in self.description:
            raise ValueError(f"mechanism {self.name!r} needs a name and a one-line description")
        if self.expectation_fn is not None and self.log_probabilities_fn is None:
            raise ValueError(f"mechanism {self.name!r}: an expectation_fn needs log_probabilities_fn (exact)")
        if any(k != spec.name for k, spec in self.params.items()):
            raise ValueError(f"mechanism {self.name!r}: params must map each spec's own name to it")
        object.__setattr__(self, "params", param_specs(*self.params.values()))  # a read-only copy
        if not isinstance(self.privacy, Privacy):
            raise ValueError(f"mechanism {self.name!r} needs a Privacy declaration, got {self.privacy!r}")
        if self.privacy.audit.kind is AuditKind.EXACT and not self.exact:
            raise ValueError(f"mechanism {self.name!r}: an exact audit needs log_probabilities_fn")
        for setting in self.privacy.audit.settings:
            if not set(setting) <= set(self.params):
                raise ValueError(
                    f"mechanism {self.name!r}: its audit sets {sorted(set(setting) - set(self.params))}, "
                    "which it does not take"
                )

    @property
    def exact(self) -> bool:
        return self.log_probabilities_fn is not None

    @property
    def private(self) -> bool:
        return self.privacy.private


def _declared(
    name: str,
    neighbouring: Neighbouring,
    audit: Audit,
    privacy_map: PrivacyMap = pure,
    split: Callable[[Mapping[str, float]], Split] | None = None,
) -> Privacy:
    """A built-in mechanism's declaration; its proof is the section named after it."""
    return Privacy(privacy_map, neighbouring, audit, f"{PROOFS}#{name}", split)


_BOUNDED, _ANY = Neighbouring.BOUNDED, Neighbouring.ANY
_EXACT = Audit(AuditKind.EXACT)
_TIGHT = Audit(AuditKind.EXACT, reach=0.4)  # the box vertices attain ≥ 40 % of ε (the audit is not vacuous)
_GEM = Audit(AuditKind.EXACT, ({}, {"beta": 0.2}), reach=0.4)
_STOPPING = Audit(AuditKind.STATISTICAL, ({"gamma": 0.05},))  # about 1/γ draws per sample: 20

_BUILTIN = (
    Mechanism(
        "rnm",
        "report noisy max: argmax(q + Z), Z ~ Exponential(mean 2Δmax/ε)",
        noisy_max.rnm_sample,
        noisy_max.rnm_log_probabilities,
        expectation_fn=noisy_max.rnm_expectation,
        privacy=_declared("rnm", _BOUNDED, _TIGHT),
    ),
    Mechanism(
        "rnm_laplace",
        "report noisy max: argmax(q + Z), Z ~ Laplace(2Δmax/ε)",
        noisy_max.rnm_laplace_sample,
        noisy_max.rnm_laplace_log_probabilities,
        privacy=_declared("rnm_laplace", _BOUNDED, _TIGHT),
    ),
    Mechanism(
        "em",
        "exponential mechanism: P(a) ∝ exp(ε q_a / 2Δmax)",
        noisy_max.em_sample,
        noisy_max.em_log_probabilities,
        expectation_fn=noisy_max.em_expectation,
        privacy=_declared("em", _BOUNDED, _TIGHT),
    ),
    Mechanism(
        "pf",
        "permute-and-flip (same distribution as rnm)",
        noisy_max.pf_sample,
        noisy_max.rnm_log_probabilities,
        expectation_fn=noisy_max.rnm_expectation,
        privacy=_declared("pf", _BOUNDED, _TIGHT),
    ),
    Mechanism(
        "krr",
        "k-ary randomised response on the argmax: argmax w.p. e^ε/(e^ε+n−1), others 1/(e^ε+n−1); "
        "tied maxima share uniformly",
        randomized_response.krr_sample,
        randomized_response.krr_log_probabilities,
        expectation_fn=randomized_response.krr_expectation,
        privacy=_declared("krr", _ANY, _TIGHT),
    ),
    Mechanism(
        "random",
        "uniform over the candidates (baseline, 0-DP)",
        randomized_response.random_sample,
        randomized_response.random_log_probabilities,
        expectation_fn=randomized_response.random_expectation,
        privacy=_declared("random", _ANY, _EXACT),
    ),
    Mechanism(
        "rnmh",
        "report noisy max with Z_a ~ Exponential(mean 2Δ_a/ε) (paper §IV-A; reference only)",
        noisy_max.rnmh_sample,
        privacy=_declared("rnmh", _BOUNDED, Audit(AuditKind.NONE), not_private),
    ),
    Mechanism(
        "rs",
        "Liu–Talwar random stopping: uniform draws, Laplace(3Δ_a/ε), stop w.p. γ",
        random_stopping.rs_sample,
        params=param_specs(random_stopping.GAMMA),
        privacy=_declared("rs", _BOUNDED, _STOPPING),
    ),
    Mechanism(
        "rs_improved",
        "Papernot–Steinke stopping (η=0): K ~ Logarithmic(1−γ) draws, Laplace(2Δ_a/ε)",
        random_stopping.rs_improved_sample,
        params=param_specs(random_stopping.GAMMA),
        privacy=_declared("rs_improved", _BOUNDED, _STOPPING),
    ),
    Mechanism(
        "gem",
        "generalised exponential mechanism: t = 2 ln(n/β)/ε, s = q − tΔ, "
        "q'_a = min_a' (s_a−s_a')/(Δ_a+Δ_a'), rnm on q' with Δ = 1",
        gem.gem_sample,
        gem.gem_log_probabilities,
        param_specs(gem.BETA),
        expectation_fn=gem.gem_expectation,
        privacy=_declared("gem", _BOUNDED, _GEM),
    ),
    Mechanism(
        "mgem",
        "modified GEM: as gem with t = −2 ln(n/β)/ε",
        gem.mgem_sample,
        gem.mgem_log_probabilities,
        param_specs(gem.BETA),
        expectation_fn=gem.mgem_expectation,
        privacy=_declared("mgem", _BOUNDED, _GEM),
    ),
    Mechanism(
        "combined_gem",
        "RR (ε_c = cε) on [spearman(q, Δ) ≥ 0], then mgem (1) / gem (0) with ε − ε_c",
        gem.combined_gem_sample,
        gem.combined_gem_log_probabilities,
        param_specs(gem.BETA, gem.CORR_BUDGET_FRACTION),
        expectation_fn=gem.combined_gem_expectation,
        privacy=_declared(
            "combined_gem",
            _BOUNDED,
            Audit(AuditKind.EXACT, ({}, {"beta": 0.2, "corr_budget_fraction": 0.25}), reach=0.4),
            split=gem.correlation_split,
        ),
    ),
)
_REGISTRY: dict[str, Mechanism] = {}
_PARAMS: dict[str, ParamSpec] = {}  # every declared parameter, in order of first declaration

MECHANISMS: Mapping[str, Mechanism] = MappingProxyType(_REGISTRY)
PARAMS: Mapping[str, ParamSpec] = MappingProxyType(_PARAMS)
PARAM_NAMES: KeysView[str] = PARAMS.keys()  # a live view: it follows register/unregister


def register(mech: Mechanism) -> Mechanism:
    """Add ``mech`` to :data:`MECHANISMS` (at import or startup time). A parameter name means one
    spec everywhere: a spec that differs from one already declared under its name is refused."""
    if not isinstance(mech, Mechanism):
        raise TypeError(f"register takes a Mechanism, got {type(mech).__name__}")
    if mech.name in _REGISTRY:
        raise ValueError(f"mechanism {mech.name!r} is already registered")
    for pname, spec in mech.params.items():
        if pname in _RESERVED:
            raise ValueError(f"mechanism {mech.name!r}: parameter name {pname!r} is an argument of select")
        if _PARAMS.get(pname, spec) != spec:
            raise ValueError(
                f"mechanism {mech.name!r}: parameter {pname!r} differs from the spec declared by "
                f"{', '.join(takers(pname))}; a parameter name has one spec"
            )
    _REGISTRY[mech.name] = mech
    _sync_params()
    return mech


def unregister(name: str) -> None:
    """Remove a mechanism added by :func:`register` (the built-in ones stay)."""
    if any(m.name == name for m in _BUILTIN):
        raise ValueError(f"mechanism {name!r} is built in and cannot be removed")
    if name not in _REGISTRY:
        raise ValueError(f"mechanism {name!r} is not registered")
    del _REGISTRY[name]
    _sync_params()


@contextmanager
def registered(mech: Mechanism) -> Iterator[Mechanism]:
    """``with registered(m):`` — ``m`` is in the registry inside the block only (tests)."""
    register(mech)
    try:
        yield mech
    finally:
        unregister(mech.name)


def _sync_params() -> None:
    _PARAMS.clear()
    for m in _REGISTRY.values():
        for pname, spec in m.params.items():
            _PARAMS.setdefault(pname, spec)


for _mech in _BUILTIN:
    register(_mech)


def takers(param: str) -> tuple[str, ...]:
    """The mechanisms that take parameter ``param``, in registry order."""
    return tuple(n for n, m in MECHANISMS.items() if param in m.params)


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


def params_of(name: str) -> Mapping[str, ParamSpec]:
    """The parameters mechanism ``name`` takes (name → spec); ``ValueError`` for an unknown name."""
    return get_mechanism(name, allow_non_private=True).params


def check_params(given: Mapping[str, object], mech: Mechanism | None = None) -> ParamValues:
    """Check every given parameter against its spec (``None`` = the default), also those
    ``mech`` does not take (they are then ignored), and refuse names no mechanism declares.
    Returns ``mech``'s own parameters, given or defaulted ({} without ``mech``)."""
    unknown = sorted(set(given) - set(PARAMS))
    if unknown:
        raise MechanismInputError(
            f"unknown mechanism parameter(s) {', '.join(unknown)}; expected only {', '.join(PARAMS)}"
        )
    values = {k: PARAMS[k].check(v) for k, v in given.items() if v is not None}
    own = mech.params if mech is not None else {}
    return MappingProxyType({k: values.get(k, spec.default) for k, spec in own.items()})


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

    ``rng`` defaults to this thread's CSPRNG (``recsvc.rng.thread_csprng``). ``params``: any
    declared parameter (:data:`PARAMS`; ``None`` = default), see :func:`check_params`. All input
    is validated before any draw; ``rnmh`` raises unless ``allow_non_private=True``.
    """
    mech = get_mechanism(name, allow_non_private)
    p = check_params(params, mech)
    eps = check_epsilon(epsilon)
    q, d = check_scores_sensitivities(scores, sensitivities)
    return int(mech.sample(q, d, eps, p, check_rng(rng), 1)[0])


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
    p = check_params(params, mech)
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
    p = check_params(params, mech)
    eps = check_epsilon(epsilon)
    q, d = check_scores_sensitivities(scores, sensitivities)
    return mech.log_probabilities_fn(q, d, eps, p)


def expectation(
    name: str, scores: object, sensitivities: object, epsilon: float, values: object, **params: object
) -> float:
    """Exact E[values[output]] for finite ``values`` ≥ 0 (n,), e.g. squared gaps: the mechanism's
    ``expectation_fn`` where declared, else ``probabilities(...) @ values``;
    ``NotImplementedError`` where no exact form exists."""
    mech = get_mechanism(name, allow_non_private=True)
    if mech.log_probabilities_fn is None:
        raise NotImplementedError(
            f"mechanism {name!r} has no exact selection probabilities; estimate expectations with select_batch"
        )
    p = check_params(params, mech)
    eps = check_epsilon(epsilon)
    q, d = check_scores_sensitivities(scores, sensitivities)
    v = np.asarray(values, dtype=np.float64)
    if v.shape != q.shape or not np.isfinite(v).all() or (v < 0).any():
        raise MechanismInputError(
            f"values must be {q.shape[0]} finite numbers ≥ 0 (one per candidate), got shape {v.shape}"
        )
    if mech.expectation_fn is not None:
        return float(mech.expectation_fn(q, d, eps, p, v))
    return float(np.exp(mech.log_probabilities_fn(q, d, eps, p)) @ v)


def probabilities(
    name: str, scores: object, sensitivities: object, epsilon: float, **params: object
) -> npt.NDArray[np.float64]:
    """Exact P(output = a), shape (n,) (sums to 1 up to ~1e-12). ``NotImplementedError`` for
    ``rs``, ``rs_improved`` and ``rnmh``."""
    log_p = log_probabilities(name, scores, sensitivities, epsilon, **params)
    return cast("npt.NDArray[np.float64]", np.exp(log_p))  # numpy types ufunc calls as Any
