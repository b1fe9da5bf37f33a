"""ε-DP selection mechanisms with heterogeneous sensitivities (docs/reference/specification.md §2).

Public API::

    from recsvc.mechanisms import MECHANISMS, select, select_batch, probabilities, expectation
    from recsvc.mechanisms import select_slate, select_two_stage  # k-item slates, private top-m
    from recsvc.mechanisms import valid_slate, draw_slate  # the same in two steps: check once, then draw
    from recsvc.mechanisms import valid_two_stage, draw_two_stage
    from recsvc.mechanisms import select_rows  # one selection per row of a batch, one Generator
    from recsvc.mechanisms import valid_slates, draw_rows  # the same in two steps: check once, then draw
    from recsvc.mechanisms import charged_epsilon  # the ε a selection consumes (what to charge)
    from recsvc.mechanisms import selection_map  # its privacy map (d_in, ε) → d_out

All functions take ALREADY CLIPPED scores (clip each score to its item's [lo, hi] first: that
is what makes Δ_a a true bound) and validate their input before drawing any randomness. Each
mechanism declares its parameters (``MECHANISMS[name].params``: name → :class:`ParamSpec`);
validation, defaults and command-line flags are derived from them. Each also declares its
privacy (``MECHANISMS[name].privacy``: :class:`Privacy`, with its map, neighbouring relation,
audit and proof; docs/concepts/mechanisms.md lists them).
"""

from recsvc.mechanisms.accounting import charged_epsilon, selection_map, selection_split
from recsvc.mechanisms.flags import add_param_arguments, flag, params_from_namespace
from recsvc.mechanisms.mechanism import Mechanism
from recsvc.mechanisms.params import ParamSpec, ParamValues, param_specs
from recsvc.mechanisms.privacy import (
    Audit,
    AuditKind,
    DistanceMap,
    Neighbouring,
    Privacy,
    Split,
    Stage,
    not_private,
    pure,
)
from recsvc.mechanisms.registry import (
    MECHANISMS,
    PARAM_NAMES,
    PARAMS,
    NonPrivateMechanismError,
    check_params,
    default_mechanisms,
    expectation,
    get_mechanism,
    log_probabilities,
    params_of,
    probabilities,
    register,
    registered,
    select,
    select_batch,
    takers,
    unregister,
)
from recsvc.mechanisms.rows import draw_rows, rows_drawable, select_rows
from recsvc.mechanisms.slate import (
    ValidSlate,
    draw_slate,
    select_slate,
    slate_log_probabilities,
    slate_probabilities,
    valid_slate,
    valid_slates,
)
from recsvc.mechanisms.two_stage import (
    ValidTwoStage,
    draw_two_stage,
    select_two_stage,
    two_stage_log_probabilities,
    two_stage_probabilities,
    valid_two_stage,
)
from recsvc.mechanisms.validation import MechanismInputError, MechanismParamError

__all__ = [
    "MECHANISMS",
    "PARAMS",
    "PARAM_NAMES",
    "Audit",
    "AuditKind",
    "DistanceMap",
    "Mechanism",
    "MechanismInputError",
    "MechanismParamError",
    "Neighbouring",
    "NonPrivateMechanismError",
    "ParamSpec",
    "ParamValues",
    "Privacy",
    "Split",
    "Stage",
    "ValidSlate",
    "ValidTwoStage",
    "add_param_arguments",
    "charged_epsilon",
    "check_params",
    "default_mechanisms",
    "draw_rows",
    "draw_slate",
    "draw_two_stage",
    "expectation",
    "flag",
    "get_mechanism",
    "log_probabilities",
    "not_private",
    "param_specs",
    "params_from_namespace",
    "params_of",
    "probabilities",
    "pure",
    "register",
    "registered",
    "rows_drawable",
    "select",
    "select_batch",
    "select_rows",
    "select_slate",
    "select_two_stage",
    "selection_map",
    "selection_split",
    "slate_log_probabilities",
    "slate_probabilities",
    "takers",
    "two_stage_log_probabilities",
    "two_stage_probabilities",
    "unregister",
    "valid_slate",
    "valid_slates",
    "valid_two_stage",
]
