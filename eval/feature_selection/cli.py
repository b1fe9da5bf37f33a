"""``recsvc eval-feature-selection`` (see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recsvc.mechanisms import add_param_arguments, params_from_namespace

# Literal copies of the study's defaults keep `recsvc --help` free of numpy; tests/eval checks
# they match eval.feature_selection.config.
DEFAULT_EPSILONS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
DEFAULT_KS = (5, 8)
DATASETS = ("fan-lv", "diabetes")
SETTINGS = ("W1", "W1/W2")
NEIGHBOURING = ("add-remove", "replace")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-feature-selection",
        help="seed 004's private feature selection study: DP-SIS (clm) vs Kifer et al.'s two-stage",
        description="Figure 1 (non-private SIS vs two-stage, per-feature selection counts) and accuracy "
        "across ε against the non-private Lasso's top k on the Fan & Lv synthetic data and scikit-learn's "
        "diabetes data, with DP-SIS's TOP/GREAT/GOOD rates. Writes figure1.csv, accuracy.csv, "
        "nonprivate.csv, rates.csv, comparisons.csv, PNG plots, summary.json and report.md.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results/feature-selection"),
        help="results directory (default: results/feature-selection)",
    )
    p.add_argument(
        "--datasets",
        nargs="*",
        default=DATASETS,
        metavar="NAME",
        help=f"the accuracy study's datasets, of {', '.join(DATASETS)}; none skips it",
    )
    p.add_argument(
        "--settings", nargs="*", default=SETTINGS, metavar="NAME", help="Figure 1's settings; none skips Figure 1"
    )
    p.add_argument("--ks", nargs="+", type=int, default=DEFAULT_KS, metavar="K", help="features to select, 1 ≤ k ≤ d")
    p.add_argument("--epsilons", nargs="+", type=float, default=DEFAULT_EPSILONS, metavar="EPS", help="ε values > 0")
    p.add_argument("--trials", type=int, default=100, help="private selections per dataset, method, k and ε")
    p.add_argument("--repetitions", type=int, default=1000, help="Figure 1's datasets per setting")
    p.add_argument(
        "--neighbouring",
        choices=NEIGHBOURING,
        default="add-remove",
        help="the neighbouring relation: DP-SIS's Δ is 1 (add-remove a row) or 2 (replace one)",
    )
    p.add_argument("--lasso-alpha", type=float, default=0.1, help="the Lasso's λ (scikit-learn's alpha)")
    p.add_argument("--mechanism", default="clm", help="the private top-k mechanism of both methods (a registry name)")
    add_param_arguments(p, names=("loss_weight",))
    p.add_argument("--seed", type=int, default=0, help="seed of every dataset's and trial's stream")
    p.add_argument("--force", action="store_true", help="replace an existing --out directory")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from eval.feature_selection.config import FeatureSelectionConfig
    from eval.feature_selection.report import summary
    from eval.feature_selection.run import run

    result = run(
        FeatureSelectionConfig(
            out=args.out,
            datasets=tuple(args.datasets),
            settings=tuple(args.settings),
            ks=tuple(args.ks),
            epsilons=tuple(args.epsilons),
            trials=args.trials,
            repetitions=args.repetitions,
            neighbouring=args.neighbouring,
            lasso_alpha=args.lasso_alpha,
            mechanism=args.mechanism,
            params=params_from_namespace(args),
            seed=args.seed,
            force=args.force,
        )
    )
    print(summary(result))
    return 0
