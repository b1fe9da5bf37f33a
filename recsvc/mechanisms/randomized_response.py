"""Randomised-response family: krr (k-ary randomised response on the argmax) and random.

Scores are ALREADY CLIPPED (the caller owns the per-item [lo, hi]); inputs are validated.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_sampling import krr_exact_sample
from recsvc.mechanisms.params import ParamValues


def krr_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> np.ndarray:
    """P(argmax) = e^ε/(e^ε + n − 1), every other candidate 1/(e^ε + n − 1).

    Ties for the maximum share the argmax mass uniformly (uniform random tie-breaking), so each
    probability stays in [1/Z, e^ε/Z]. Computed in log space (no overflow for large ε).
    """
    n = q.shape[0]
    top = q == q.max()
    k = int(top.sum())
    # log Z = log(e^ε + n − 1) = ε + log1p((n − 1) e^{−ε})
    log_z = epsilon + np.log1p((n - 1) * np.exp(-epsilon))
    out = np.full(n, -log_z)
    # tied maxima: (1 + (e^ε − 1)/k)/Z = ((k − 1 + e^ε)/k)/Z each
    out[top] = epsilon + np.log1p((k - 1) * np.exp(-epsilon)) - np.log(k) - log_z
    return out


def krr_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.intp]:
    """k-ary randomised response on the argmax of q.

    Privacy: ε-DP (pure) for ANY change of the scores: every output probability lies in
    [1/Z, e^ε/Z] with the same Z on every input. Ignores Δ.

    Sampled exactly (:mod:`recsvc.mechanisms.exact_sampling`): one of the k tied maxima with
    probability (k − 1 + e^ε)/(n − 1 + e^ε), uniform within the chosen group — the law of
    :func:`krr_log_probabilities` at every ε, with no float δ.
    """
    return krr_exact_sample(q, epsilon, rng, size)


def random_log_probabilities(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues) -> np.ndarray:
    return np.full(q.shape[0], -np.log(q.shape[0]))


def random_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> np.ndarray:
    """Uniform over the candidates. Privacy: 0-DP (the output does not depend on the data)."""
    return rng.integers(0, q.shape[0], size)


def krr_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    return float(np.exp(krr_log_probabilities(q, d, epsilon, p)) @ values)


def random_expectation(q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, values: np.ndarray) -> float:
    return float(np.mean(values))
