"""Multi-selection in one dimension (docs/concepts/multi-selection.md): the device adds Laplace
noise of scale 1/ε to its private value (ε-geographic DP, :mod:`.geographic`), the server answers
the noisy signal with k points, and the device keeps the nearest (:mod:`.response`). In d
dimensions (:mod:`.embedding`) the device sends a noisy embedding of its history, the server
weights a public population by the signal's likelihood (:mod:`.posterior`) and picks k items
greedily (:mod:`.greedy`). Pure numpy and scipy: what the service and the evaluation build on."""

from __future__ import annotations

from recsvc.multiselection.embedding import (
    check_radius,
    clip_l1,
    device_signal,
    embed,
    embedding_version,
    noise_scale,
)
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
from recsvc.multiselection.greedy import baseline, dense_greedy, expected_utility, greedy, respond
from recsvc.multiselection.posterior import WEIGHT_FLOOR, Population, log_likelihood, posterior_weights
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
    "WEIGHT_FLOOR",
    "Disutility",
    "Floats",
    "Population",
    "Response",
    "baseline",
    "check_disutility",
    "check_radius",
    "clip_l1",
    "dense_greedy",
    "device_signal",
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
    "log_likelihood",
    "monte_carlo_error",
    "noise_scale",
    "optimal_response",
    "posterior_weights",
    "privacy_loss",
    "respond",
    "sample_signal",
    "signal_cdf",
    "signal_log_density",
]
