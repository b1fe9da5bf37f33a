"""Report-noisy-max family: rnm, rnm_laplace, rnmh (NOT DP), em, pf.

All functions take ALREADY CLIPPED scores q (n,) and public sensitivities Δ (n,): clipping to
each item's [lo, hi] is the caller's job (it owns the ranges) and is what makes Δ a bound.
They assume validated input (see ``validation.py``) and return ``size`` i.i.d. draws.

Ties: the noise is continuous, so equal noisy values have probability 0; the exact races
(rnm, pf, rnm_laplace) refine until there is none, and rnmh's float draws let the lowest
candidate index win one — a fixed rule that does not look at the data.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact import (
    exponential_noisy_max_expectation,
    exponential_noisy_max_log_probabilities,
    laplace_noisy_max_log_probabilities,
)
from recsvc.mechanisms.exact_noise import LAPLACE
from recsvc.mechanisms.exact_race import EXPONENTIAL, GapUtilities, gap_race_rows, race_argmax
from recsvc.mechanisms.exact_sampling import em_exact_sample
from recsvc.mechanisms.params import ParamValues


def _rnm_u(q: np.ndarray, d: np.ndarray, epsilon: float) -> npt.NDArray[np.float64]:
    # Normalising by the noise mean keeps every value ≤ 0 and finite for any ε. q and d are validated
    # float64 arrays; numpy types their reductions (q.max()) as Any, and so the result.
    return cast("npt.NDArray[np.float64]", (q - q.max()) * (epsilon / (2.0 * d.max())))


def rnm_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """Report noisy max, Z_a ~ Exponential(mean 2Δmax/ε).

    Privacy: ε-DP (pure) for neighbouring inputs with |q_a − q'_a| ≤ Δ_a ≤ Δmax for every a
    (McKenna & Sheldon 2020; Ding et al. 2021). Same output distribution as ``pf``.

    Sampled exactly (:mod:`recsvc.mechanisms.exact_race`): the argmax of the real
    (q_a − q*)·ε/(2Δmax) − ln U_a for real uniforms U_a, at every ε (no float bound on the noise).
    """
    return race_argmax(GapUtilities(q, epsilon, float(d.max())), EXPONENTIAL, rng, size)


def rnm_rows(
    q: np.ndarray, d: np.ndarray, lengths: np.ndarray, epsilons: np.ndarray, p: ParamValues, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """:func:`rnm_sample` on each row of a ragged batch, the rows' exact races in one compiled pass."""
    return gap_race_rows(q, d, lengths, epsilons, 2, rng)


def rnm_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> npt.NDArray[np.float64]:
    return exponential_noisy_max_log_probabilities(_rnm_u(q, d, epsilon))


def rnm_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    return exponential_noisy_max_expectation(_rnm_u(q, d, epsilon), values)


def rnm_laplace_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """Report noisy max, Z_a ~ Laplace(scale 2Δmax/ε).

    Privacy: ε-DP (pure) for arbitrary (not necessarily monotone) changes |q_a − q'_a| ≤ Δ_a ≤ Δmax
    (Dwork & Roth 2014, §3.3: Laplace(Δ/ε) suffices for monotone scores, 2Δ/ε in general).

    Sampled exactly: the race of (q_a − q*)·ε/(2Δmax) + L_a for real Laplace L_a
    (:mod:`recsvc.mechanisms.exact_race` with :data:`recsvc.mechanisms.exact_noise.LAPLACE`).
    """
    return race_argmax(GapUtilities(q, epsilon, float(d.max())), LAPLACE, rng, size)


def rnm_laplace_log_probabilities(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues
) -> npt.NDArray[np.float64]:
    return laplace_noisy_max_log_probabilities(_rnm_u(q, d, epsilon))


def rnmh_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """Report noisy max with heterogeneous noise Z_a ~ Exponential(mean 2Δ_a/ε).

    Privacy: **NOT differentially private** for any ε (paper §IV-A: with Δ_1 → 0 one outcome
    has probability 0 on one input and > 0 on its neighbour). Reference baseline only.
    """
    z = rng.standard_exponential((size, q.shape[0]))
    z *= 2.0 * d / epsilon
    z += q
    return cast("npt.NDArray[np.intp]", z.argmax(axis=1))  # the lowest index wins a tie; numpy: Any


def em_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """Exponential mechanism, P(a) ∝ exp(ε q_a / (2Δmax)), sampled exactly
    (:mod:`recsvc.mechanisms.exact_sampling`: no float δ at any ε).

    Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a ≤ Δmax (McSherry & Talwar 2007).
    """
    return em_exact_sample(q, d, epsilon, rng, size)


def em_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> npt.NDArray[np.float64]:
    x = _rnm_u(q, d, epsilon)  # ≤ 0: exp never overflows
    return cast("npt.NDArray[np.float64]", x - np.log(np.exp(x).sum()))  # numpy types these float64 ops as Any


def em_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    return float(np.exp(em_log_probabilities(q, d, epsilon, p)) @ values)


def pf_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """Permute-and-flip: visit candidates in uniformly random order, return the first r whose
    coin with P(heads) = p_r = exp(ε (q_r − q*) / (2Δmax)) lands heads (the argmax always does).

    The random order is given by i.i.d. uniform keys K_r (equivalent to a uniform permutation);
    the output is the heads-candidate with the smallest key. Merging each candidate's key and
    coin into one uniform U_r: the "heads-key" K_r·[heads] (∞ on tails) has P(≤ t) = p_r·t on
    [0, 1], which is the law of U_r / p_r — so PF returns argmin_r U_r / p_r (the argmax has
    p = 1, so the minimum is always a heads), i.e. argmax_r (log p_r − ln U_r): ``rnm``'s race
    with E_r = −ln U_r. It is sampled by that exact race (:func:`rnm_sample`); the tests hold it
    to the brute-force permutation-and-coins law.
    Privacy: ε-DP (pure), same output distribution as ``rnm`` (McKenna & Sheldon 2020).
    """
    return rnm_sample(q, d, epsilon, p, rng, size)
