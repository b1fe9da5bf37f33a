"""The registry of selection mechanisms and the public API (docs/reference/specification.md §2).

Each entry (:class:`recsvc.mechanisms.mechanism.Mechanism`; the built-in ones are in ``builtin.py``)
declares its privacy (:class:`recsvc.mechanisms.privacy.Privacy`: map, neighbouring relation,
audit, proof); docs/concepts/mechanisms.md is generated from the entries.
Every entry point validates ALL input (``validation.py``) before drawing any randomness, so bad
input never selects anything and never moves the caller's generator. Scores must ALREADY be
clipped to each item's [lo, hi] (callers own the ranges; clipping is what makes Δ a bound).
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import cast

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.builtin import BUILTIN
from recsvc.mechanisms.mechanism import Mechanism
from recsvc.mechanisms.params import ParamSpec, ParamValues
from recsvc.mechanisms.validation import (
    MechanismInputError,
    check_at_least,
    check_batch,
    check_epsilon,
    check_inputs,
    check_rng,
    check_scale,
)
from recsvc.rng import user_stream

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
    if any(m.name == name for m in BUILTIN):
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


for _mech in BUILTIN:
    register(_mech)


def takers(param: str) -> tuple[str, ...]:
    """The mechanisms that take parameter ``param``, in registry order."""
    return tuple(n for n, m in MECHANISMS.items() if param in m.params)


def default_mechanisms() -> tuple[str, ...]:
    """The private mechanisms in the default set (``Mechanism.default``), in registry order: what
    the evaluation harness runs and `auto`'s policy table ranks when no mechanisms are named."""
    return tuple(n for n, m in MECHANISMS.items() if m.private and m.default)


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
    eps, q, d = check_inputs(epsilon, scores, sensitivities)
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
    k = check_at_least("trials", trials, 1, "an integer >= 1")
    s = check_at_least("seed", seed, 0, "a non-negative integer")
    off = check_at_least("user_offset", user_offset, 0, "a non-negative integer")
    q, d = check_batch(scores, sensitivities)
    check_scale(eps, q, d)
    if mech.batch is not None:
        return mech.batch(q, d, eps, p, lambda b: user_stream(s, off + b), k)
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
    eps, q, d = check_inputs(epsilon, scores, sensitivities)
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
    eps, q, d = check_inputs(epsilon, scores, sensitivities)
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
