"""ε-DP selection mechanisms with heterogeneous sensitivities (SPEC §2).

Public API::

    from recsvc.mechanisms import MECHANISMS, select, select_batch, probabilities
    from recsvc.mechanisms import select_slate, select_two_stage  # k-item slates, private top-m

All functions take ALREADY CLIPPED scores (clip each score to its item's [lo, hi] first: that
is what makes Δ_a a true bound) and validate their input before drawing any randomness.
"""

from recsvc.mechanisms.registry import (
    MECHANISMS,
    Mechanism,
    NonPrivateMechanismError,
    get_mechanism,
    log_probabilities,
    probabilities,
    select,
    select_batch,
)
from recsvc.mechanisms.slate import select_slate, slate_log_probabilities, slate_probabilities
from recsvc.mechanisms.two_stage import select_two_stage, two_stage_log_probabilities, two_stage_probabilities
from recsvc.mechanisms.validation import PARAM_NAMES, MechanismInputError, Params

__all__ = [
    "MECHANISMS",
    "PARAM_NAMES",
    "Mechanism",
    "MechanismInputError",
    "NonPrivateMechanismError",
    "Params",
    "get_mechanism",
    "log_probabilities",
    "probabilities",
    "select",
    "select_batch",
    "select_slate",
    "select_two_stage",
    "slate_log_probabilities",
    "slate_probabilities",
    "two_stage_log_probabilities",
    "two_stage_probabilities",
]
