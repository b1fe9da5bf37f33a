"""Multi-selection in one dimension (docs/concepts/multi-selection.md): the device adds Laplace
noise of scale 1/ε to its private value (ε-geographic DP, :mod:`.geographic`), the server answers
the noisy signal with k points, and the device keeps the nearest (:mod:`.response`). Pure numpy
and scipy: the theory the service and the evaluation build on."""

from __future__ import annotations

from recsvc.multiselection.device import laplace_from_bits, laplace_noise, local_choice, uniform_from_bits
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
    "Disutility",
    "Floats",
    "Response",
    "check_disutility",
    "check_radius",
    "clip_l1",
    "device_signal",
    "embed",
    "expected_error",
    "geographic_excess",
    "identity_error",
    "identity_expected_error",
    "identity_offsets",
    "interval_log_ratio",
    "laplace_from_bits",
    "laplace_noise",
    "laplace_scale",
    "local_choice",
    "monte_carlo_error",
    "noise_scale",
    "optimal_response",
    "privacy_loss",
    "sample_signal",
    "signal_cdf",
    "signal_log_density",
    "uniform_from_bits",
]
