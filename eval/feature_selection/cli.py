"""``recsvc eval-feature-selection`` (see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse

from eval.feature_selection.config import FeatureSelectionConfig
from recsvc.mechanisms import add_param_arguments, params_from_namespace
from recsvc.settings import add_arguments, from_namespace


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-feature-selection",
        help="seed 004's private feature selection study: DP-SIS (clm) vs Kifer et al.'s two-stage",
        description="Figure 1 (non-private SIS vs two-stage, per-feature selection counts) and accuracy "
        "across ε against the non-private Lasso's top k on the Fan & Lv synthetic data and scikit-learn's "
        "diabetes data, with DP-SIS's TOP/GREAT/GOOD rates. Writes figure1.csv, accuracy.csv, "
        "nonprivate.csv, rates.csv, comparisons.csv, PNG plots, summary.json and report.md.",
    )
    add_arguments(p, FeatureSelectionConfig, skip=("seed", "force"))
    add_param_arguments(p, names=("loss_weight",))
    add_arguments(p, FeatureSelectionConfig, only=("seed", "force"))
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from eval.feature_selection.report import summary
    from eval.feature_selection.run import run

    print(summary(run(from_namespace(FeatureSelectionConfig, args, params=params_from_namespace(args)))))
    return 0
