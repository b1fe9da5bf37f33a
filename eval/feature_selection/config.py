"""The study's parameters, checked in one place before anything is made or written."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from eval.feature_selection.data import DATASET_FEATURES, DATASETS, SETTINGS
from eval.feature_selection.methods import DEFAULT_LASSO_ALPHA, NEIGHBOURING
from recsvc.checks import ParamError, check_epsilon, check_int
from recsvc.mechanisms import check_params, get_mechanism
from recsvc.staging import check_out

DEFAULT_OUT = Path("results/feature-selection")
DEFAULT_EPSILONS: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
DEFAULT_KS: tuple[int, ...] = (5, 8)
DEFAULT_TRIALS = 100
DEFAULT_REPETITIONS = 1000
DEFAULT_MECHANISM = "clm"


@dataclass(frozen=True)
class FeatureSelectionConfig:
    out: Path | None = DEFAULT_OUT  # None: compute only, write nothing
    datasets: Sequence[str] = DATASETS  # the accuracy study; () skips it
    settings: Sequence[str] = SETTINGS  # Figure 1; () skips it
    ks: Sequence[int] = DEFAULT_KS
    epsilons: Sequence[float] = DEFAULT_EPSILONS
    trials: int = DEFAULT_TRIALS  # private selections per (dataset, method, k, ε)
    repetitions: int = DEFAULT_REPETITIONS  # Figure 1's datasets per setting
    neighbouring: str = "add-remove"
    lasso_alpha: float = DEFAULT_LASSO_ALPHA
    mechanism: str = DEFAULT_MECHANISM  # the private top k of both methods
    params: Mapping[str, float | None] = field(default_factory=dict)  # the mechanism's (loss_weight …)
    seed: int = 0
    force: bool = False
    progress: bool | None = None  # None: tqdm decides (off when not a TTY)


def _grid(param: str, values: Sequence[object], known: Sequence[str] | None = None) -> tuple:
    if isinstance(values, str):
        values = (values,)
    if len(set(values)) != len(values):
        raise ParamError(f"{{{param}}} must be distinct, got {{values}}", values=" ".join(map(str, values)))
    if known is not None:
        for v in values:
            if v not in known:
                raise ParamError(
                    f"unknown {{{param}}} value {{value}}; expected some of {{known}}",
                    value=repr(v),
                    known=", ".join(known),
                )
    return tuple(values)


def validate(cfg: FeatureSelectionConfig) -> FeatureSelectionConfig:
    """Every check before any work (nothing is created). Returns the grids as sorted tuples and
    the mechanism's own parameters, given or defaulted (what the run uses)."""
    datasets = _grid("datasets", cfg.datasets, DATASETS)
    settings = _grid("settings", cfg.settings, SETTINGS)
    if not datasets and not settings:
        raise ParamError("{datasets} and {settings} are both empty; expected at least one of them")
    ks = _grid("ks", tuple(check_int("ks", k, 1) for k in cfg.ks))
    epsilons = _grid("epsilons", tuple(check_epsilon(e, "{epsilons}", ParamError) for e in cfg.epsilons))
    if datasets and not (ks and epsilons):
        raise ParamError("{ks} and {epsilons} need at least one value each for the accuracy study")
    for name in datasets:
        d = DATASET_FEATURES[name]
        if max(ks) > d:
            raise ParamError(
                "{ks} = {k} is out of range for dataset {dataset}; expected 1 ≤ k ≤ {d} (its features)",
                k=max(ks),
                dataset=name,
                d=d,
            )
    trials = check_int("trials", cfg.trials, 1)
    repetitions = check_int("repetitions", cfg.repetitions, 1)
    if cfg.neighbouring not in NEIGHBOURING:
        raise ParamError(
            "unknown {neighbouring} relation {value}; expected one of {known}",
            value=repr(cfg.neighbouring),
            known=", ".join(NEIGHBOURING),
        )
    alpha = cfg.lasso_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ParamError("{lasso_alpha} must be a positive finite number, got {value}", value=repr(alpha))
    try:
        params = check_params(dict(cfg.params), get_mechanism(cfg.mechanism))
    except ValueError as exc:
        raise ParamError("{mechanism}: {problem}", problem=str(exc)) from None
    seed = check_int("seed", cfg.seed, 0)
    if cfg.out is not None:
        check_out(cfg.out, cfg.force)
    return replace(
        cfg,
        datasets=datasets,
        settings=settings,
        ks=tuple(sorted(ks)),
        epsilons=tuple(sorted(epsilons)),
        trials=trials,
        repetitions=repetitions,
        lasso_alpha=float(alpha),
        params=MappingProxyType(dict(params)),
        seed=seed,
    )
