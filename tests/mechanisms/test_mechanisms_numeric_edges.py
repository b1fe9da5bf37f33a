"""Numeric edges found by peer libraries' test suites: a finite but huge ε, score gaps of
hundreds of noise scales, a uniform draw of exactly 0, and inputs that are not real numbers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from recsvc.checks import ParamError
from recsvc.mechanisms import MECHANISMS, log_probabilities, select, select_batch, select_slate
from recsvc.mechanisms.noisy_max import pf_sample
from recsvc.mechanisms.testing import Words
from recsvc.mechanisms.validation import MechanismInputError

EXACT = [n for n, m in MECHANISMS.items() if m.exact and n != "random"]  # random ignores the scores


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_an_epsilon_whose_noise_scale_overflows_is_refused_before_any_draw(name: str) -> None:
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    with pytest.raises(ParamError, match=r"epsilon=1e\+303 is too large for these inputs.*expected epsilon ≤ 2e\+300"):
        select(name, [1.0, 0.0], [1e-6, 1e-6], 1e303, rng, allow_non_private=True)
    assert rng.bit_generator.state == before
    with pytest.raises(ParamError, match="too large"):
        select_batch(name, [[1.0, 0.0]], [1e-6, 1e-6], 1e303, 2, 0, allow_non_private=True)
    with pytest.raises(ParamError, match="too large"):
        select_slate(name, [1.0, 0.0, 0.5], [1e-6] * 3, 1e303, 2, rng, allow_non_private=True)


@pytest.mark.parametrize("name", EXACT)
def test_the_largest_accepted_epsilon_gives_finite_probabilities_on_the_best_item(name: str) -> None:
    q, d = [1.0, 0.0, 1.0 - 1e-3], [1e-6] * 3  # ε/(2Δ) = 5e305: gaps of 5e302 and 5e305 noise scales
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow, no invalid value: the computation stays finite
        logp = log_probabilities(name, q, d, 1e300)
        picks = {select(name, q, d, 1e300, np.random.default_rng(s)) for s in range(20)}
    assert not np.isnan(logp).any() and logp[0] == pytest.approx(0.0, abs=1e-9) and logp[1] < -1e5
    assert picks == {0}


def test_pf_computes_in_log_space_and_a_zero_draw_never_wins() -> None:
    q, d = np.array([0.0, 1000.0, 999.0]), np.ones(3)  # gaps of 1000 and 1 noise scales at ε = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e^{1000} would overflow
        draws = pf_sample(q, d, 2.0, {}, np.random.default_rng(0), 20_000)
    counts = np.bincount(draws, minlength=3)
    assert counts[0] == 0
    # P(2) = e^{-1}/(1 + e^{-1})·… exactly as rnm: the law of argmax(log p + Exp(1)) over {1, 2}
    assert counts[2] / 20_000 == pytest.approx(np.exp(log_probabilities("pf", q, d, 2.0))[2], abs=0.01)

    # Drawn from [0, 1) and multiplied by 1/p, a 0 made candidate 0 win whatever its score; the
    # exact race reads more bits of both uniforms (here equal) until the scores decide.
    zeros = Words([0, 0], then=5)  # both U = 5·2⁻¹¹⁷·(1 + 2⁻⁶⁴ + …): equal noise, the higher score wins
    assert pf_sample(np.array([0.0, 1.0]), np.ones(2), 50.0, {}, zeros, 1).tolist() == [1]  # type: ignore[arg-type]  # a stand-in generator


@pytest.mark.parametrize(
    "scores",
    [["1", "0"], np.array(["1.5", "0"]), np.array([1 + 0j, 0j]), [1 + 2j, 0.0], np.array([1, None], dtype=object)],
)
def test_strings_complex_numbers_and_objects_are_refused_as_the_service_does(scores: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning: refused before any cast
        with pytest.raises(MechanismInputError, match=r"scores must be an array of real numbers \(int or float\)"):
            select("em", scores, [1.0, 1.0], 1.0)
        with pytest.raises(MechanismInputError, match=r"sensitivities must be an array of real numbers"):
            select("em", [1.0, 0.0], scores, 1.0)
    assert select("em", [1, 0], np.array([1, 1], dtype=np.int64), 1.0) in (0, 1)  # integers are real numbers
