"""Random-stopping family: rs (Liu–Talwar, paper Algorithm 1) and rs_improved (Papernot–Steinke).

Each base draw picks a candidate a uniformly (with replacement, independent of the data) and
releases q_a + Laplace(cΔ_a/ε) with FRESH noise on every draw: an (ε/c)-DP release that uses the
candidate's own sensitivity. The number of draws K is random and the best recorded noisy
value wins. Scores are ALREADY CLIPPED by the caller; inputs are validated. Every part is
sampled exactly from its real-number law (:mod:`recsvc.mechanisms.exact_stopping`); ties between
records have probability 0.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.mechanisms.exact_stopping import best_record, geometric_counts, logarithmic_counts
from recsvc.mechanisms.params import ParamSpec, ParamValues

# Random stopping makes about 1/γ draws per selection (each an array entry, all inside the
# service's ledger transaction): a smaller γ is a memory and latency hazard, not a useful setting.
GAMMA = ParamSpec(
    "gamma",
    0.008,
    0.0,
    1.0,
    "stopping probability γ of random stopping (about 1/γ draws per selection)",
    floor=1e-6,
    floor_reason="random stopping makes about 1/gamma draws per selection",
)


def rs_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.int64]:
    """Liu–Talwar random stopping: after each draw stop with probability γ (K ~ Geometric(γ)).

    Noise Laplace(3Δ_a/ε) per draw. Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a, any γ ∈ (0,1):
    each draw is (ε/3)-DP and geometric random stopping with best-of output is 3·(ε/3)-DP
    (Liu & Talwar 2019, Thm 3.4; paper §IV-B). Expected draws per call: 1/γ.
    """
    counts = geometric_counts(p["gamma"], size, rng)
    return best_record(q, d, 3, epsilon, counts, rng)


def rs_improved_sample(
    q: np.ndarray, d: np.ndarray, epsilon: float, p: ParamValues, rng: np.random.Generator, size: int
) -> npt.NDArray[np.int64]:
    """Papernot–Steinke random stopping with η = 0: K ~ Logarithmic, P(K=k) = (1−γ)^k/(k ln(1/γ)).

    Noise Laplace(2Δ_a/ε) per draw. Privacy: ε-DP (pure) for |q_a − q'_a| ≤ Δ_a, any γ ∈ (0,1):
    each draw is (ε/2)-DP and the truncated-negative-binomial (η = 0: logarithmic) repetition is
    (2 + η)·(ε/2)-DP (Papernot & Steinke 2022, Thm 2; paper Appendix C).
    """
    counts = logarithmic_counts(p["gamma"], size, rng)
    return best_record(q, d, 2, epsilon, counts, rng)
