"""The one-shot slates and the other mechanisms of issue 36's second part: the float defects the
peers' suites found (clm's translation, a spurious overflow warning) and exact sampling."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from recsvc.mechanisms import log_probabilities, select_slate, slate_log_probabilities, slate_probabilities


def _set_probabilities(law: dict[tuple[int, ...], float]) -> dict[frozenset[int], float]:
    out: dict[frozenset[int], float] = {}
    for s, lp in law.items():
        out[frozenset(s)] = out.get(frozenset(s), 0.0) + math.exp(lp)
    return out


def test_clm_gives_the_same_law_for_scores_far_from_zero_as_for_the_centred_ones() -> None:
    q = 1e12 + np.array([0, 0.3, 1.1, 1.7, 2]) * 1e-3
    far = slate_log_probabilities("clm", q, [1e-3] * 5, 4.0, 2)
    centred = slate_log_probabilities("clm", q - 1e12, [1e-3] * 5, 4.0, 2)  # the same gaps, exactly
    assert max(abs(far[s] - centred[s]) for s in far) < 1e-9  # dividing by Δmax first: 0.094


def test_clm_far_from_zero_loses_at_most_epsilon_and_reaches_it() -> None:
    """Scores at 2⁴⁸ have a float spacing of 1/16: dividing before centring lost 1.015ε here."""
    q = 2.0**48 + np.array([0.527, 2.59, 1.624])
    q2 = q + np.array([1.0, -1.0, -1.0])
    loss = np.abs(
        log_probabilities("clm", q, [1.0] * 3, 8.0, loss_weight=0.99)
        - log_probabilities("clm", q2, [1.0] * 3, 8.0, loss_weight=0.99)
    ).max()
    assert 0.98 * 8.0 < loss <= 8.0 * (1 + 1e-9)


def test_clm_at_the_top_of_the_float_range_samples_its_finite_law() -> None:
    q = 1e303 * (1 + np.arange(4) * 1e-15)
    law = _set_probabilities(slate_log_probabilities("clm", q, [1e-6] * 4, 2e-294, 2))
    assert all(math.isfinite(p) for p in law.values())
    p23 = law[frozenset({2, 3})]
    assert 0.40 < p23 < 0.44  # 0.4206...; the division overflowed and always gave {2, 3}
    rng = np.random.default_rng(5)
    hits = sum(set(select_slate("clm", q, [1e-6] * 4, 2e-294, 2, rng).tolist()) == {2, 3} for _ in range(2000))
    se = math.sqrt(p23 * (1 - p23) / 2000)
    assert abs(hits / 2000 - p23) < 5 * se


def test_the_oneshot_slate_law_at_large_epsilon_warns_of_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        law = slate_probabilities("oneshot", [0, 1, 2, 3], [1] * 4, 1000.0, 2)
    assert law[(3, 2)] == pytest.approx(1.0)
