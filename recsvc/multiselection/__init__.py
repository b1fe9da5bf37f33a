"""Multi-selection in one dimension (docs/concepts/multi-selection.md): the device adds Laplace
noise of scale 1/ε to its private value (ε-geographic DP, :mod:`.geographic`), the server answers
the noisy signal with k points, and the device keeps the nearest (:mod:`.response`). In d
dimensions (:mod:`.embedding`) the device sends a noisy embedding of its history, the server
weights a public population by the signal's likelihood (:mod:`.posterior`) and picks k items
greedily (:mod:`.greedy`). What a device sends is the exactly ε-DP lattice signal
(:mod:`.lattice`, with the exact noise of :mod:`.discrete`); the continuous signal of
:mod:`.embedding` remains the model the evaluation measures. Pure numpy and scipy: what the service and the evaluation build on."""

from __future__ import annotations

from recsvc.multiselection.device import laplace_from_bits, laplace_noise, local_choice, uniform_from_bits
from recsvc.multiselection.discrete import Words, bernoulli_exp, discrete_laplace, rate, uniform_below
from recsvc.multiselection.embedding import check_radius, clip_l1, device_signal, embed, noise_scale
from recsvc.multiselection.geographic import (
    Floats,
    geographic_excess,
    interval_log_ratio,
    laplace_scale,
    privacy_loss,
    sample_signal,
    signal_cdf,
    signal_log_density,
)
from recsvc.multiselection.greedy import baseline, dense_greedy, expected_utility, greedy, respond, respond_lattice
from recsvc.multiselection.lattice import (
    GRID_STEPS,
    SIGNAL_LIMIT,
    Lattice,
    discrete_laplace_log_pmf,
    embedding_version,
    lattice_log_likelihood,
    pull_in,
)
from recsvc.multiselection.posterior import (
    WEIGHT_FLOOR,
    Population,
    log_likelihood,
    posterior_weights,
    weights_from_log_likelihood,
)
from recsvc.multiselection.response import (
    Disutility,
    Response,
    check_disutility,
    expected_error,
    identity_error,
    identity_expected_error,
    identity_offsets,
    monte_carlo_error,
    optimal_response,
)

__all__ = [
    "GRID_STEPS",
    "SIGNAL_LIMIT",
    "WEIGHT_FLOOR",
    "Disutility",
    "Floats",
    "Lattice",
    "Population",
    "Response",
    "Words",
    "baseline",
    "bernoulli_exp",
    "check_disutility",
    "check_radius",
    "clip_l1",
    "dense_greedy",
    "device_signal",
    "discrete_laplace",
    "discrete_laplace_log_pmf",
    "embed",
    "embedding_version",
    "expected_error",
    "expected_utility",
    "geographic_excess",
    "greedy",
    "identity_error",
    "identity_expected_error",
    "identity_offsets",
    "interval_log_ratio",
    "laplace_from_bits",
    "laplace_noise",
    "laplace_scale",
    "lattice_log_likelihood",
    "local_choice",
    "log_likelihood",
    "monte_carlo_error",
    "noise_scale",
    "optimal_response",
    "posterior_weights",
    "privacy_loss",
    "pull_in",
    "rate",
    "respond",
    "respond_lattice",
    "sample_signal",
    "signal_cdf",
    "signal_log_density",
    "uniform_below",
    "uniform_from_bits",
    "weights_from_log_likelihood",
]
