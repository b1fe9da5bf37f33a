"""One evaluation run's configuration and every check that needs no data (docs/reference/specification.md §6)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eval.pipelines import DEFAULT_M, DEFAULT_SLATE_K, parse_pipelines
from recsvc.checks import ParamError, check_epsilon, check_int
from recsvc.engines import resolve_workers
from recsvc.policy import AUTO, EVALUATION_EPSILONS
from recsvc.staging import check_out

# 0.01 … 16 (docs/reference/specification.md §6); the policy grid holds them
DEFAULT_EPSILONS: tuple[float, ...] = EVALUATION_EPSILONS
DEFAULT_TRIALS = 50
SCENARIO_GAMMA = 0.05  # rs γ of the paper's synthetic experiments (§VI); an artifact's is in its manifest
DEFAULT_CHUNK_SIZE = 256  # users per work unit when the run is large
MIN_AUTO_CHUNK = 16  # automatic chunks never get smaller than this (per-chunk overhead)
CHUNKS_PER_WORKER = 4  # automatic chunking aims for this many chunks per worker (progress, balance)
DEFAULT_LEVEL = 0.8  # sweep scenario's t when none is given


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation run. Exactly one of ``artifacts`` / ``scenario`` is the data source."""

    artifacts: Path | None = None
    scenario: str | None = None
    n: int = 100  # scenario candidates
    level: float | None = None  # sweep scenario's t (None = 0.8); only for scenario "sweep"
    users: int | None = None  # first N users (artifact) / rows (scenario); None = all / default
    mechanisms: tuple[str, ...] | None = None  # None = the registry's default set (default_mechanisms)
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    exact: bool = False
    # Mechanism parameters by name (recsvc.mechanisms.PARAMS). Absent or None: the data's own where
    # it has one (γ, eval.run.with_data_defaults), else each mechanism's default. Each mechanism is
    # called with the ones it takes (mechanism_params).
    params: Mapping[str, float | None] = field(default_factory=dict)
    engine: str = "local"
    workers: int | None = None
    scheduler: str | None = None
    chunk_size: int | None = None  # None = automatic: ≤ 256, ≥ 4 chunks per worker, ≥ 16 users
    out: Path | None = None
    force: bool = False  # replace an existing ``out`` directory (never the artifact directory)
    progress: bool | None = None
    ratio_epsilon: float = 1.0  # ε whose mGEM/GEM log-ratio is plotted against correlation
    # Candidate pipelines and slate metrics (eval.pipelines); () = none, the default outputs only.
    pipelines: tuple[str, ...] = ()
    slate_k: tuple[int, ...] = DEFAULT_SLATE_K
    two_stage_m: int = DEFAULT_M  # top500's m and two-stage's private top-m
    two_stage_trials: int | None = None  # Monte Carlo trials of two-stage pipelines; None = trials


def level_dirname(level: float) -> str:
    """``t-5``, ``t-0.8``, ``t0`` …: a sweep level's name (its results sub-directory; −0.0 is ``t0``)."""
    return f"t{float(level) + 0.0:g}"


def mechanism_params(cfg: EvalConfig, mechanism: str) -> dict[str, float]:
    """The keyword parameters ``mechanism`` is called with: the given values of the parameters it
    declares (``params_of``; a missing or None value leaves its own default). The one place that
    maps config → params."""
    from recsvc.mechanisms import params_of

    return {k: v for k, v in cfg.params.items() if k in params_of(mechanism) and v is not None}


def param_values(cfg: EvalConfig) -> dict[str, float]:
    """The value of every parameter the default mechanism set or a named mechanism declares: the
    given one (or the data's, once eval.run.with_data_defaults filled it in), else its spec's
    default. For the report and the summary's echo of the config."""
    from recsvc.mechanisms import PARAMS, default_mechanisms, params_of

    used = {p for name in {*default_mechanisms(), *(cfg.mechanisms or ())} for p in params_of(name)}
    return {k: s.default if (v := cfg.params.get(k)) is None else s.check(v) for k, s in PARAMS.items() if k in used}


def protected(cfg: EvalConfig) -> dict[str, Path]:
    """The run's inputs that its results directory must never be, contain or replace."""
    return {} if cfg.artifacts is None else {"artifacts": Path(cfg.artifacts)}


def _check_out(cfg: EvalConfig) -> None:
    """The results directory must never touch the artifact it reads (nor the working directory):
    :func:`recsvc.staging.check_out`. Only stats, no writes."""
    if cfg.out is None:
        return
    check_out(cfg.out, cfg.force, protect=protected(cfg))


def validate(cfg: EvalConfig) -> tuple[str, ...]:
    """Every check that needs no data (parameters, out); raises ValueError, returns the mechanisms.
    :func:`eval.run.run` calls it first; the demo calls it before building anything."""
    from recsvc.mechanisms import MECHANISMS, check_params, default_mechanisms

    if (cfg.artifacts is None) == (cfg.scenario is None):
        raise ParamError("give exactly one data source: {artifacts} DIR or {scenario} NAME")
    if cfg.level is not None and cfg.scenario != "sweep":
        src = "{scenario} {name}" if cfg.scenario is not None else "{artifacts}"
        raise ParamError(
            f"{{level}} applies only to {{scenario}} sweep, got it with {src}; "
            "drop {level} or use {scenario} sweep",
            name=cfg.scenario,
        )
    check_int("seed", cfg.seed, 0)
    check_int("trials", cfg.trials, 1)
    for param, value in (("users", cfg.users), ("chunk_size", cfg.chunk_size)):
        if value is not None:
            check_int(param, value, 1)
    resolve_workers(cfg.workers)
    r = cfg.ratio_epsilon
    if isinstance(r, bool) or not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
        raise ParamError("{ratio_epsilon} must be a finite number > 0, got {value}", value=repr(r))
    if not cfg.epsilons:
        raise ValueError("no ε given; expected at least one ε > 0")
    for eps in cfg.epsilons:
        check_epsilon(eps, "ε")
    if len(set(cfg.epsilons)) != len(cfg.epsilons):
        raise ValueError(f"ε values must be distinct, got {list(cfg.epsilons)}")
    if not isinstance(cfg.params, Mapping):
        raise ValueError(f"params must be a mapping of parameter name to value, got {type(cfg.params).__name__}")
    check_params(cfg.params)  # each against its spec; a name no mechanism declares is refused
    names = tuple(cfg.mechanisms) if cfg.mechanisms else default_mechanisms()
    unknown = [m for m in names if m not in MECHANISMS and m != AUTO]
    if unknown:
        raise ValueError(f"unknown mechanism(s) {unknown}; expected some of {', '.join(MECHANISMS)}, or {AUTO}")
    if len(set(names)) != len(names):
        raise ValueError(f"mechanisms must be distinct, got {list(names)}")
    parse_pipelines(
        tuple(cfg.pipelines), tuple(cfg.slate_k), cfg.two_stage_m, cfg.two_stage_trials, cfg.artifacts is not None
    )
    _check_out(cfg)
    return names


def chunk_size(cfg: EvalConfig, total: int) -> int:
    """The explicit --chunk-size, else ≤ 256 users but small enough that every worker gets
    ~4 chunks (a moving progress bar, both cores busy), never below 16 users. Per-user results
    and aggregates do not depend on it (per-user streams; fixed-block merging, see RunningMean)."""
    if cfg.chunk_size is not None:
        return int(cfg.chunk_size)
    workers = resolve_workers(cfg.workers)
    return max(MIN_AUTO_CHUNK, min(DEFAULT_CHUNK_SIZE, -(-total // (CHUNKS_PER_WORKER * workers))))
