"""The study's parameters and the checks across them (eval.study runs both before any work)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from eval.feature_selection.data import DATASET_FEATURES, DATASETS, SETTINGS
from eval.feature_selection.methods import DEFAULT_LASSO_ALPHA, NEIGHBOURING
from eval.study import distinct
from recsvc.checks import ParamError, check_epsilon, check_int
from recsvc.mechanisms import check_params, get_mechanism
from recsvc.settings import OneOf, Range, setting


@dataclass(frozen=True)
class FeatureSelectionConfig:
    # None: compute only, write nothing
    out: Path | None = setting(Path("results/feature-selection"), unit="dir", help="results directory")
    datasets: Sequence[str] = setting(
        DATASETS, nargs="*", unit="name", help=f"the accuracy study's datasets, of {', '.join(DATASETS)}; none skips it"
    )
    settings: Sequence[str] = setting(SETTINGS, nargs="*", unit="name", help="Figure 1's settings; none skips Figure 1")
    ks: Sequence[int] = setting((5, 8), nargs="+", type=int, unit="k", help="features to select, 1 ≤ k ≤ d")
    epsilons: Sequence[float] = setting(
        (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0), nargs="+", type=float, unit="eps", help="ε values > 0"
    )
    trials: int = setting(100, help="private selections per dataset, method, k and ε", check=Range(1, integer=True))
    repetitions: int = setting(1000, help="Figure 1's datasets per setting", check=Range(1, integer=True))
    neighbouring: str = setting(
        "add-remove",
        help="the neighbouring relation: DP-SIS's Δ is 1 (add-remove a row) or 2 (replace one)",
        check=OneOf(NEIGHBOURING),
    )
    lasso_alpha: float = setting(
        DEFAULT_LASSO_ALPHA, help="the Lasso's λ (scikit-learn's alpha)", check=Range(0, low_open=True)
    )
    mechanism: str = setting("clm", help="the private top-k mechanism of both methods (a registry name)")
    params: Mapping[str, float | None] = field(default_factory=dict)  # the mechanism's (loss_weight …)
    seed: int = setting(0, help="seed of every dataset's and trial's stream", check=Range(0, integer=True))
    force: bool = setting(False, help="replace an existing --out directory")
    progress: bool | None = None  # None: tqdm decides (off when not a TTY)


def validate(cfg: FeatureSelectionConfig) -> FeatureSelectionConfig:
    """The checks the settings do not make. Returns the grids as sorted tuples and the
    mechanism's own parameters, given or defaulted (what the run uses)."""
    datasets = distinct("datasets", cfg.datasets, DATASETS)
    settings = distinct("settings", cfg.settings, SETTINGS)
    if not datasets and not settings:
        raise ParamError("{datasets} and {settings} are both empty; expected at least one of them")
    ks = distinct("ks", tuple(check_int("ks", k, 1) for k in cfg.ks))
    epsilons = distinct("epsilons", tuple(check_epsilon(e, "{epsilons}", ParamError) for e in cfg.epsilons))
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
    try:
        params = check_params(dict(cfg.params), get_mechanism(cfg.mechanism))
    except ValueError as exc:
        raise ParamError("{mechanism}: {problem}", problem=str(exc)) from None
    return replace(
        cfg,
        datasets=datasets,
        settings=settings,
        ks=tuple(sorted(ks)),
        epsilons=tuple(sorted(epsilons)),
        trials=int(cfg.trials),
        repetitions=int(cfg.repetitions),
        lasso_alpha=float(cfg.lasso_alpha),
        params=params,
        seed=int(cfg.seed),
    )
