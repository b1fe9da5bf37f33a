"""One evaluation run's configuration and every check that needs no data (docs/reference/specification.md §6)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eval.evaluation.pipelines import DEFAULT_M, DEFAULT_SLATE_K, parse_pipelines
from recsvc.checks import ParamError
from recsvc.engines import resolve_workers
from recsvc.mechanisms import MECHANISMS, PARAMS, check_params, default_mechanisms, params_of
from recsvc.policy import AUTO, EVALUATION_EPSILONS
from recsvc.settings import Each, OneOf, Range, check, setting
from recsvc.staging import check_out

# 0.01 … 16 (docs/reference/specification.md §6); the policy grid holds them
DEFAULT_EPSILONS: tuple[float, ...] = EVALUATION_EPSILONS
DEFAULT_TRIALS = 50
SCENARIO_GAMMA = 0.05  # rs γ of the paper's synthetic experiments (§VI); an artifact's is in its manifest
DEFAULT_CHUNK_SIZE = 256  # users per work unit when the run is large
MIN_AUTO_CHUNK = 16  # automatic chunks never get smaller than this (per-chunk overhead)
CHUNKS_PER_WORKER = 4  # automatic chunking aims for this many chunks per worker (progress, balance)
DEFAULT_LEVEL = 0.8  # sweep scenario's t when none is given


_NOT_DP = ", ".join(n for n, m in MECHANISMS.items() if not m.private)
_AT_LEAST_1 = Range(1, integer=True, none=True)


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation run. Exactly one of ``artifacts`` / ``scenario`` is the data source."""

    artifacts: Path | None = setting(None, unit="dir", help="artifact directory, e.g. artifacts/ml-100k")
    scenario: str | None = setting(
        None,
        help="1 … 8, sweep (Figure 10) or proportion (Figure 18: scenarios 1–3 over the share of high scores)",
    )
    n: int = setting(100, help="candidates of a synthetic scenario")
    level: float | None = None  # sweep scenario's t (None = 0.8); only for scenario "sweep"
    users: int | None = setting(
        None, help="only the first N test users (default: all)", check=_AT_LEAST_1
    )  # rows of a scenario
    mechanisms: tuple[str, ...] | None = setting(
        None,
        nargs="+",
        unit="name",
        help=f"mechanisms to compare (default: the registry's default set, every private single-item one; {_NOT_DP} only if named)",
    )
    epsilons: tuple[float, ...] = setting(
        DEFAULT_EPSILONS,
        flag_default=None,
        nargs="+",
        type=float,
        unit="eps",
        help="privacy parameters ε > 0 (default: 0.01 … 16, 11 values)",
        check=Each(Range(0, low_open=True)),
    )
    trials: int = setting(DEFAULT_TRIALS, help="selections per user, mechanism and ε", check=Range(1, integer=True))
    exact: bool = setting(
        False, help="expected MSE from exact probabilities; Monte Carlo (and a note) where a mechanism has none"
    )
    seed: int = setting(0, help="seed; user b uses SeedSequence(seed, spawn_key=(b,))", check=Range(0, integer=True))
    # Mechanism parameters by name (recsvc.mechanisms.PARAMS). Absent or None: the data's own where
    # it has one (γ, eval.evaluation.run.with_data_defaults), else each mechanism's default. Each mechanism is
    # called with the ones it takes (mechanism_params).
    params: Mapping[str, float | None] = field(default_factory=dict)
    engine: str = setting(
        "local", help="where the work units run: local processes or a Dask cluster", check=OneOf(("local", "dask"))
    )
    workers: int | None = setting(None, help="worker processes (default: min(2, cores))")
    scheduler: str | None = setting(None, unit="address", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    chunk_size: int | None = setting(
        None,
        help="users per work unit (default: 256, smaller for small runs so each worker gets ~4)",
        check=_AT_LEAST_1,
    )  # None = automatic: ≤ 256, ≥ 4 chunks per worker, ≥ 16 users
    out: Path | None = setting(
        None, unit="dir", help="results directory (default: results/<dataset> or results/scenario-NAME)"
    )
    force: bool = setting(False, help="replace an existing --out directory (never the --artifacts directory)")
    progress: bool | None = None
    ratio_epsilon: float = setting(
        1.0,
        help="ε of the mGEM/GEM log-ratio scatter plot (nearest in the grid; default 1)",
        check=Range(0, low_open=True),
    )
    # Candidate pipelines and slate metrics (eval.evaluation.pipelines); () = none, the default outputs only.
    pipelines: tuple[str, ...] = setting(
        (),
        nargs="+",
        unit="pipe",
        help="also evaluate candidate pipelines over each test user's FULL-catalog scores: top500 (the "
        "paper's non-private pre-filter, NOT end-to-end DP), full, two-stage:F[:MECH] (private top-m with "
        "F·ε, F in (0, 1), by rnm peeling or one run of MECH: oneshot, gumbel, clm); writes pipelines.csv, "
        "a winner table, plots and a report section",
    )
    slate_k: tuple[int, ...] = setting(
        DEFAULT_SLATE_K,
        flag_default=None,
        nargs="+",
        type=int,
        unit="k",
        help="slate sizes of the pipeline metrics (default: 1 5 10)",
    )
    two_stage_m: int = setting(
        DEFAULT_M, flag_default=None, help="m: top500's and two-stage's candidate count (default 500)"
    )
    two_stage_trials: int | None = setting(
        None, help="Monte Carlo trials of the two-stage pipelines (default: --trials; each peels m selections)"
    )  # None = trials


def level_dirname(level: float) -> str:
    """``t-5``, ``t-0.8``, ``t0`` …: a sweep level's name (its results sub-directory; −0.0 is ``t0``)."""
    return f"t{float(level) + 0.0:g}"


def mechanism_params(cfg: EvalConfig, mechanism: str) -> dict[str, float]:
    """The keyword parameters ``mechanism`` is called with: the given values of the parameters it
    declares (``params_of``; a missing or None value leaves its own default). The one place that
    maps config → params."""
    return {k: v for k, v in cfg.params.items() if k in params_of(mechanism) and v is not None}


def param_values(cfg: EvalConfig) -> dict[str, float]:
    """The value of every parameter the default mechanism set or a named mechanism declares: the
    given one (or the data's, once eval.evaluation.run.with_data_defaults filled it in), else its spec's
    default. For the report and the summary's echo of the config."""
    named = {*default_mechanisms(), *(cfg.mechanisms or ())} - {AUTO}  # auto runs the others' parameters
    used = {p for name in named for p in params_of(name)}
    return {k: s.default if (v := cfg.params.get(k)) is None else s.check(v) for k, s in PARAMS.items() if k in used}


def protected(cfg: EvalConfig) -> dict[str, Path]:
    """The run's inputs that its results directory must never be, contain or replace."""
    return {} if cfg.artifacts is None else {"artifacts": Path(cfg.artifacts)}


def validate(cfg: EvalConfig) -> tuple[str, ...]:
    """Every check that needs no data (parameters, out); raises ValueError, returns the mechanisms.
    :func:`eval.evaluation.run.run` calls it first; the demo calls it before building anything."""
    check(cfg)
    if (cfg.artifacts is None) == (cfg.scenario is None):
        raise ParamError("give exactly one data source: {artifacts} DIR or {scenario} NAME")
    if cfg.level is not None and cfg.scenario != "sweep":
        src = "{scenario} {name}" if cfg.scenario is not None else "{artifacts}"
        raise ParamError(
            f"{{level}} applies only to {{scenario}} sweep, got it with {src}; "
            "drop {level} or use {scenario} sweep",
            name=cfg.scenario,
        )
    resolve_workers(cfg.workers)
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
    if cfg.out is not None:  # never the artifact it reads (nor the working directory); only stats
        check_out(cfg.out, cfg.force, protect=protected(cfg))
    return names


def chunk_size(cfg: EvalConfig, total: int) -> int:
    """The explicit --chunk-size, else ≤ 256 users but small enough that every worker gets
    ~4 chunks (a moving progress bar, both cores busy), never below 16 users. Per-user results
    and aggregates do not depend on it (per-user streams; fixed-block merging, see RunningMean)."""
    if cfg.chunk_size is not None:
        return int(cfg.chunk_size)
    workers = resolve_workers(cfg.workers)
    return max(MIN_AUTO_CHUNK, min(DEFAULT_CHUNK_SIZE, -(-total // (CHUNKS_PER_WORKER * workers))))
