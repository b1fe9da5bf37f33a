"""Multi-selection in one dimension (docs/concepts/multi-selection.md): the device adds Laplace
noise of scale 1/ε to its private value (ε-geographic DP, :mod:`.geographic`), the server answers
the noisy signal with k points, and the device keeps the nearest (:mod:`.response`). In d
dimensions (:mod:`.embedding`) the device sends a noisy embedding of its history, the server
weights a public population by the signal's likelihood (:mod:`.posterior`) and picks k items
greedily (:mod:`.greedy`). What a device sends is exactly ε-DP: by default the index of its best
item of a public codebook by C-ary randomised response (:mod:`.code`), or the lattice signal
(:mod:`.lattice`), both with the exact noise of :mod:`.discrete`; the evaluation measures exactly
that. Pure numpy and scipy: what the service and the evaluation build on."""

from __future__ import annotations

from recsvc.multiselection.code import (
    CODE_SIZES,
    SizeChoice,
    blind_codebook,
    choose_size,
    code_log_likelihood,
    code_of,
    codebook_bytes,
    codebook_version,
    prototype_codes,
    randomized_response,
    respond_code,
    rr_law,
)
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
    "CODE_SIZES",
    "GRID_STEPS",
    "SIGNAL_LIMIT",
    "Disutility",
    "Floats",
    "Lattice",
    "Population",
    "Response",
    "SizeChoice",
    "Words",
    "baseline",
    "bernoulli_exp",
    "blind_codebook",
    "check_disutility",
    "check_radius",
    "choose_size",
    "clip_l1",
    "code_log_likelihood",
    "code_of",
    "codebook_bytes",
    "codebook_version",
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
    "prototype_codes",
    "pull_in",
    "randomized_response",
    "rate",
    "respond_code",
    "respond_lattice",
    "rr_law",
    "sample_signal",
    "signal_cdf",
    "signal_log_density",
    "uniform_below",
    "weights_from_log_likelihood",
]
