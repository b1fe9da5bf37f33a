"""Multi-selection in one dimension (docs/concepts/multi-selection.md): the device adds Laplace
noise of scale 1/ε to its private value (ε-geographic DP, :mod:`.geographic`), the server answers
the noisy signal with k points, and the device keeps the nearest (:mod:`.response`). In d
dimensions (:mod:`.embedding`) the device sends a noisy embedding of its history, the server
weights a public population by the signal's likelihood (:mod:`.posterior`) and picks k items
greedily (:mod:`.greedy`). What a device sends is the exactly ε-DP lattice signal
(:mod:`.lattice`, with the exact noise of :mod:`.discrete`), and the evaluation measures exactly
that. Pure numpy and scipy: what the service and the evaluation build on."""

from __future__ import annotations

from recsvc.multiselection.device import local_choice
from recsvc.multiselection.discrete import Words, bernoulli_exp, discrete_laplace, rate, uniform_below
from recsvc.multiselection.embedding import check_radius, clip_l1, embed
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
from recsvc.multiselection.greedy import baseline, dense_greedy, expected_utility, greedy, respond_lattice
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
    "laplace_scale",
    "lattice_log_likelihood",
    "local_choice",
    "monte_carlo_error",
    "optimal_response",
    "privacy_loss",
    "pull_in",
    "rate",
    "respond_lattice",
    "sample_signal",
    "signal_cdf",
    "signal_log_density",
    "uniform_below",
    "weights_from_log_likelihood",
]
