"""The float64 samplers that issue 36's exact ones replaced, installed in place of them in this
process (a benchmark-only patch), so a server built afterwards draws as it did before: the
service's cost of exactness, measured side by side (:mod:`scripts.bench.transport`'s variant
``float-samplers``, :mod:`scripts.bench.recommend`'s ``--against-float``).

Replaced: the single draws of the noisy-max family (rnm, pf, gem, mgem, combined_gem, rnm_laplace,
as :mod:`scripts.bench.exact_sampling` keeps them verbatim) and gem's and mgem's native peels
(:mod:`scripts.bench.gem_peel_float`). The one-shot slates and random stopping keep their exact
samplers: the service's default paths (Select and Recommend, one item or a k = 10 `auto` slate)
run only the replaced ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PEELS = {"gem": 1.0, "mgem": -1.0}


def install() -> list[str]:
    """Swaps the samplers in the registry; the names replaced."""
    from recsvc.mechanisms import MECHANISMS
    from scripts.bench.exact_sampling import FLOAT_NOISY_MAX
    from scripts.bench.gem_peel_float import peel_float

    def single(name: str) -> Any:
        fn = FLOAT_NOISY_MAX[name]

        def sample(q: np.ndarray, d: np.ndarray, eps: float, p: Any, rng: np.random.Generator, size: int) -> Any:
            return fn(q, d, eps, rng, size)

        return sample

    def peel(sign: float) -> Any:
        def peel_fn(q: np.ndarray, d: np.ndarray, eps_step: float, p: Any, rng: np.random.Generator, k: int) -> Any:
            return peel_float(sign, q, d, eps_step, float(p["beta"]), k, rng)

        return peel_fn

    for name in FLOAT_NOISY_MAX:
        object.__setattr__(MECHANISMS[name], "sample", single(name))  # the registry's records are frozen
        object.__setattr__(MECHANISMS[name], "batch", None)
    for name, sign in PEELS.items():
        object.__setattr__(MECHANISMS[name], "peel_fn", peel(sign))
    return sorted({*FLOAT_NOISY_MAX, *PEELS})
