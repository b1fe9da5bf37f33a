"""``recsvc eval``, ``eval-synthetic``, ``eval-bandit``, ``eval-two-candidates``, ``eval-multiselect`` and
``eval-feature-selection``
(see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.evaluation.config import EvalConfig
from eval.study import findings_text
from recsvc.mechanisms import add_param_arguments, params_from_namespace
from recsvc.settings import add_argument, add_arguments, from_namespace, setting, settings_of


@dataclass(frozen=True)
class Choices:
    """What a command chooses to run, read by the command itself before any config is built."""

    # a number is EvalConfig's level; 'all' is another run, the whole sweep
    level: str | None = setting(
        None,
        unit="level",
        help="sweep level t, only with --scenario sweep (default 0.8), or 'all': the paper's seven "
        "(-5 -0.8 -0.3 0 0.3 0.8 5) in one results directory with sweep.csv, sweep.png, report.md",
    )
    theory: bool = setting(False, help="the 1-D theory")  # a mode of eval-multiselect, like a sub-command


def _flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, name: str, **changes: Any) -> None:
    """``cls``'s setting ``name`` as this command states it (``required``, an alias, its help)."""
    d = next(d for d in settings_of(cls) if d.name == name)
    add_argument(parser, dataclasses.replace(d, spec=dataclasses.replace(d.spec, **changes)))


def _common(p: argparse.ArgumentParser) -> None:
    add_arguments(p, EvalConfig, only=("mechanisms", "epsilons", "trials", "exact", "seed"))
    # --beta, --gamma, --corr-budget-fraction from the mechanisms' specs; γ defaults to the data's.
    add_param_arguments(
        p,
        defaults={
            "gamma": "the paper's for the data: the artifact manifest's default_gamma, "
            "0.008 for MovieLens/Amazon-book, 0.0008 for Netflix; 0.05 for "
            "synthetic scenarios"
        },
    )
    add_arguments(p, EvalConfig, only=("engine", "workers", "scheduler", "chunk_size", "ratio_epsilon", "force"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate selection mechanisms on an artifact's test users",
        description="Every mechanism × ε on each test user's top candidates: MSE tables, "
        "correlation statistics, PNG plots and report.md.",
    )
    _flag(p, EvalConfig, "artifacts", required=True)
    add_arguments(p, EvalConfig, only=("users", "out", "pipelines", "slate_k", "two_stage_m", "two_stage_trials"))
    _common(p)
    p.set_defaults(func=_run_eval)

    s = sub.add_parser(
        "eval-synthetic",
        help="evaluate selection mechanisms on a synthetic scenario from the paper",
        description="Scenarios: 1–3 bimodal, 4–6 realistic, 7–8 combined-GEM polarised, "
        "sweep (Figure 10, --level t), proportion (Figure 18).",
    )
    _flag(s, EvalConfig, "scenario", required=True)
    add_arguments(s, EvalConfig, only=("n",))
    _flag(
        s,
        EvalConfig,
        "users",
        aliases=("--repeats",),
        help="synthetic users = score draws (default: 1 for scenarios 1–3, 1000 for 4–6, 5000 for 7–8, "
        "100 independent instances per sweep level)",
    )
    add_arguments(s, Choices, only=("level",))
    add_arguments(s, EvalConfig, only=("out",))
    _common(s)
    s.set_defaults(func=_run_synthetic)
    _register_two_candidates(sub)
    _register_multiselect(sub)
    _register_feature_selection(sub)


def _register_two_candidates(sub: argparse._SubParsersAction) -> None:
    from eval.bandit.config import BanditConfig
    from eval.two_candidates.hg import TwoCandidateConfig

    t = sub.add_parser(
        "eval-two-candidates",
        help="the paper's two-candidate analysis: HG(M, M') heatmaps, exact",
        description="HG(M, M') = Pr[M errs] - Pr[M' errs] for two candidates (q1 = 0 < q2 = gap, "
        "Δ1 the lower one's sensitivity) over Δ1 × Δ2 × ε × gap, from exact "
        "probabilities: hg.parquet, Figures 3, 15, 16, 17 and the GEM family as PNGs, "
        "report.md with the paper's statements checked.",
    )
    add_arguments(t, TwoCandidateConfig)
    t.set_defaults(func=_run_two_candidates)

    b = sub.add_parser(
        "eval-bandit",
        help="the paper's bandit study under distribution shift (§IX, Figure 14)",
        description="Two arms whose reward distributions swap at --shift: non-private UCB and "
        "Thompson sampling vs private kRR, RNM, RS, GEM and mGEM selecting on private "
        "means and sensitivities. Writes bandit.parquet, summary tables with 95%% CIs "
        "over seeds, Figure 14(a)–(d) PNGs and report.md.",
    )
    _flag(b, BanditConfig, "out", required=True)
    add_arguments(b, BanditConfig, only=("seeds", "horizon", "shift", "workers", "force"))
    b.set_defaults(func=_run_bandit)


def _register_multiselect(sub: argparse._SubParsersAction) -> None:
    from eval.multiselect.data import DatasetConfig
    from eval.multiselect.theory import TheoryConfig

    m = sub.add_parser(
        "eval-multiselect",
        help="multi-selection: the device adds the noise, the server returns k results (--theory or --artifacts)",
        description="--theory: the 1-D theory of docs/concepts/multi-selection.md. theory.csv has, per "
        "(k, ε), the exact error of the server's optimal k offsets for a Laplace signal, a seeded "
        "Monte Carlo estimate and the offsets; offsets.png and scaled_error.png plot them. "
        "--artifacts: multi-selection on each artifact's test users (both server responses) side by "
        "side with Recommend over the full catalog and Select over the top 500 (auto, central DP) at "
        "the same ε: multiselect.csv (utility fraction, hit rate, MSE with 95%% CIs), plots, report.md.",
    )
    mode = m.add_mutually_exclusive_group(required=True)
    add_arguments(mode, Choices, only=("theory",))
    add_arguments(mode, DatasetConfig, only=("artifacts",))
    add_arguments(m, DatasetConfig, only=("out", "ks", "epsilons"))
    add_arguments(m, TheoryConfig, only=("mc_draws",))
    add_arguments(m, DatasetConfig, only=("users", "trials", "workers", "chunk_size", "seed", "force"))
    m.set_defaults(func=_run_multiselect)


def _register_feature_selection(sub: argparse._SubParsersAction) -> None:
    from eval.feature_selection.config import FeatureSelectionConfig

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
    p.set_defaults(func=_run_feature_selection)


def _run_multiselect(args: argparse.Namespace) -> int:
    from eval.multiselect import theory
    from eval.multiselect.data import DatasetConfig

    if args.theory:
        given = {k: tuple(v) for k in ("ks", "epsilons") if (v := getattr(args, k)) is not None}
        _default_out(args, "multiselect")
        cfg = from_namespace(theory.TheoryConfig, args, out=args.out, seed=args.seed, force=args.force, **given)
        print(theory.summary(theory.run_theory(cfg)))
        return 0
    from eval.multiselect.run import run_datasets, summary

    _default_out(args, "multiselect-datasets")
    print(summary(run_datasets(from_namespace(DatasetConfig, args))))
    return 0


def _default_out(args: argparse.Namespace, name: str) -> None:
    """--out when given, else results/``name``."""
    if args.out is None:
        args.out = Path("results") / name


def _config(args: argparse.Namespace, **source: Any) -> EvalConfig:
    return from_namespace(EvalConfig, args, **source, params=params_from_namespace(args))


def _finish(result) -> int:
    from eval.evaluation.outputs import summary

    print(summary(result)[0])
    return 0


def _level(text: str | None) -> float | str | None:
    """--level: a number, or the word ``all`` (every sweep level)."""
    if text is None:
        return None
    if text.strip().lower() == "all":
        return "all"
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--level must be a number or 'all', got {text!r}") from None


def _run_eval(args: argparse.Namespace) -> int:
    from eval.evaluation.run import run

    _default_out(args, args.artifacts.resolve().name)
    return _finish(run(_config(args, artifacts=args.artifacts)))


def _run_synthetic(args: argparse.Namespace) -> int:
    from eval.evaluation.config import DEFAULT_LEVEL, level_dirname
    from eval.evaluation.run import run
    from eval.scenarios.proportion import run_proportion
    from eval.scenarios.sweep import run_sweep

    level = _level(args.level)
    name = f"scenario-{args.scenario}"
    if args.scenario == "sweep" and level != "all":  # one level: its own directory
        name += f"-{level_dirname(DEFAULT_LEVEL if level is None else float(level))}"
    _default_out(args, name)
    cfg = _config(args, scenario=args.scenario, n=args.n, level=level)
    if args.scenario == "proportion":
        res = run_proportion(cfg)
        head = f"proportion of high scores (Figure 18) at ε = {res.epsilon:g}: "
        print(findings_text(head, res.findings, res.out, f" ({res.seconds:.1f} s)"))
        return 0
    return _finish(run_sweep(dataclasses.replace(cfg, level=None)) if level == "all" else run(cfg))


def _run_bandit(args: argparse.Namespace) -> int:
    from eval.bandit.config import BanditConfig
    from eval.bandit.report import summary_text
    from eval.bandit.run import run

    print(summary_text(run(from_namespace(BanditConfig, args))))
    return 0


def _run_two_candidates(args: argparse.Namespace) -> int:
    from eval.two_candidates.hg import TwoCandidateConfig
    from eval.two_candidates.run import run_two_candidates

    res = run_two_candidates(from_namespace(TwoCandidateConfig, args))
    head = f"two candidates: {res.table.height} HG values in {res.seconds:.1f} s; "
    print(findings_text(head, res.findings, res.out))
    return 0


def _run_feature_selection(args: argparse.Namespace) -> int:
    from eval.feature_selection.config import FeatureSelectionConfig
    from eval.feature_selection.report import summary
    from eval.feature_selection.run import run

    print(summary(run(from_namespace(FeatureSelectionConfig, args, params=params_from_namespace(args)))))
    return 0
