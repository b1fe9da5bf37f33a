"""``recsvc eval``, ``eval-synthetic``, ``eval-bandit``, ``eval-two-candidates`` and ``eval-multiselect``
(see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recsvc.mechanisms import MECHANISMS, add_param_arguments, params_from_namespace


def _common(p: argparse.ArgumentParser) -> None:
    not_dp = ", ".join(n for n, m in MECHANISMS.items() if not m.private)
    p.add_argument(
        "--mechanisms",
        nargs="+",
        metavar="NAME",
        help=f"mechanisms to compare (default: the registry's default set, every private single-item one; {not_dp} only if named)",
    )
    p.add_argument(
        "--epsilons",
        nargs="+",
        type=float,
        metavar="EPS",
        default=None,
        help="privacy parameters ε > 0 (default: 0.01 … 16, 11 values)",
    )
    p.add_argument("--trials", type=int, default=50, help="selections per user, mechanism and ε (default 50)")
    p.add_argument(
        "--exact",
        action="store_true",
        help="expected MSE from exact probabilities; Monte Carlo (and a note) where a mechanism has none",
    )
    p.add_argument("--seed", type=int, default=0, help="seed; user b uses SeedSequence(seed, spawn_key=(b,))")
    # --beta, --gamma, --corr-budget-fraction from the mechanisms' specs; γ defaults to the data's.
    add_param_arguments(
        p,
        defaults={
            "gamma": "the paper's for the data: the artifact manifest's default_gamma, "
            "0.008 for MovieLens/Amazon-book, 0.0008 for Netflix; 0.05 for "
            "synthetic scenarios"
        },
    )
    p.add_argument("--engine", choices=("local", "dask"), default="local")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: min(2, cores))")
    p.add_argument("--scheduler", default=None, help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="users per work unit (default: 256, smaller for small runs so each worker gets ~4)",
    )
    p.add_argument(
        "--ratio-epsilon",
        type=float,
        default=1.0,
        help="ε of the mGEM/GEM log-ratio scatter plot (nearest in the grid; default 1)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace an existing --out directory (never the --artifacts directory)"
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate selection mechanisms on an artifact's test users",
        description="Every mechanism × ε on each test user's top candidates: MSE tables, "
        "correlation statistics, PNG plots and report.md.",
    )
    p.add_argument("--artifacts", required=True, type=Path, help="artifact directory, e.g. artifacts/ml-100k")
    p.add_argument("--users", type=int, default=None, help="only the first N test users (default: all)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default: results/<dataset>)")
    p.add_argument(
        "--pipelines",
        nargs="+",
        default=(),
        metavar="PIPE",
        help="also evaluate candidate pipelines over each test user's FULL-catalog scores: top500 (the "
        "paper's non-private pre-filter, NOT end-to-end DP), full, two-stage:F[:MECH] (private top-m with "
        "F·ε, F in (0, 1), by rnm peeling or one run of MECH: oneshot, gumbel, clm); writes pipelines.csv, "
        "a winner table, plots and a report section",
    )
    p.add_argument(
        "--slate-k",
        nargs="+",
        type=int,
        default=None,
        metavar="K",
        help="slate sizes of the pipeline metrics (default: 1 5 10)",
    )
    p.add_argument(
        "--two-stage-m", type=int, default=None, help="m: top500's and two-stage's candidate count (default 500)"
    )
    p.add_argument(
        "--two-stage-trials",
        type=int,
        default=None,
        help="Monte Carlo trials of the two-stage pipelines (default: --trials; each peels m selections)",
    )
    _common(p)
    p.set_defaults(func=_run_eval)

    s = sub.add_parser(
        "eval-synthetic",
        help="evaluate selection mechanisms on a synthetic scenario from the paper",
        description="Scenarios: 1–3 bimodal, 4–6 realistic, 7–8 combined-GEM polarised, "
        "sweep (Figure 10, --level t), proportion (Figure 18).",
    )
    s.add_argument(
        "--scenario",
        required=True,
        help="1 … 8, sweep (Figure 10) or proportion (Figure 18: scenarios 1–3 over the share of high scores)",
    )
    s.add_argument("--n", type=int, default=100, help="candidates (default 100)")
    s.add_argument(
        "--users",
        "--repeats",
        dest="users",
        type=int,
        default=None,
        help="synthetic users = score draws (default: 1 for scenarios 1–3, 1000 for 4–6, 5000 for 7–8, "
        "100 independent instances per sweep level)",
    )
    s.add_argument(
        "--level",
        default=None,
        help="sweep level t, only with --scenario sweep (default 0.8), or 'all': the paper's seven "
        "(-5 -0.8 -0.3 0 0.3 0.8 5) in one results directory with sweep.csv, sweep.png, report.md",
    )
    s.add_argument("--out", type=Path, default=None, help="results directory (default: results/scenario-NAME)")
    _common(s)
    s.set_defaults(func=_run_synthetic)
    _register_two_candidates(sub)
    _register_multiselect(sub)


def _register_two_candidates(sub: argparse._SubParsersAction) -> None:
    from eval.two_candidates import DEFAULT_BETA, DEFAULT_DELTAS, DEFAULT_EPSILONS, DEFAULT_GAMMAS, DEFAULT_GAPS

    def grid(values: tuple[float, ...]) -> str:
        return " ".join(f"{v:g}" for v in values)

    t = sub.add_parser(
        "eval-two-candidates",
        help="the paper's two-candidate analysis: HG(M, M') heatmaps, exact",
        description="HG(M, M') = Pr[M errs] - Pr[M' errs] for two candidates (q1 = 0 < q2 = gap, "
        "Δ1 the lower one's sensitivity) over Δ1 × Δ2 × ε × gap, from exact "
        "probabilities: hg.parquet, Figures 3, 15, 16, 17 and the GEM family as PNGs, "
        "report.md with the paper's statements checked.",
    )
    t.add_argument(
        "--out",
        type=Path,
        default=Path("results/two-candidates"),
        help="results directory (default: results/two-candidates)",
    )
    t.add_argument(
        "--deltas", nargs="+", type=float, default=DEFAULT_DELTAS, metavar="D", help="the grid of Δ1 and of Δ2"
    )
    t.add_argument(
        "--epsilons",
        nargs="+",
        type=float,
        default=DEFAULT_EPSILONS,
        metavar="EPS",
        help=f"ε values (default: {grid(DEFAULT_EPSILONS)}, the rows of Figs 16-17)",
    )
    t.add_argument(
        "--gaps",
        nargs="+",
        type=float,
        default=DEFAULT_GAPS,
        metavar="GAP",
        help=f"score gaps q2 - q1 (default: {grid(DEFAULT_GAPS)}, the columns of Figs 16-17)",
    )
    t.add_argument(
        "--gammas",
        nargs="+",
        type=float,
        default=DEFAULT_GAMMAS,
        metavar="GAMMA",
        help=f"RS stopping probabilities γ (default: {grid(DEFAULT_GAMMAS)}; Figs 3 and 17 use 0.01)",
    )
    t.add_argument("--beta", type=float, default=DEFAULT_BETA, help=f"GEM/mGEM β (default {DEFAULT_BETA:g})")
    t.add_argument("--force", action="store_true", help="replace an existing --out directory")
    t.set_defaults(func=_run_two_candidates)

    b = sub.add_parser(
        "eval-bandit",
        help="the paper's bandit study under distribution shift (§IX, Figure 14)",
        description="Two arms whose reward distributions swap at --shift: non-private UCB and "
        "Thompson sampling vs private kRR, RNM, RS, GEM and mGEM selecting on private "
        "means and sensitivities. Writes bandit.parquet, summary tables with 95%% CIs "
        "over seeds, Figure 14(a)–(d) PNGs and report.md.",
    )
    b.add_argument("--out", required=True, type=Path, help="results directory, e.g. results/bandit")
    b.add_argument("--seeds", type=int, default=10, help="independent runs, seeds 0 … N−1 (default 10)")
    b.add_argument("--horizon", type=int, default=50_000, help="steps T (default 50,000)")
    b.add_argument(
        "--shift", type=int, default=30_000, help="the arms swap after this step, 1 ≤ shift < horizon (default 30,000)"
    )
    b.add_argument("--workers", type=int, default=None, help="worker processes (default: min(2, cores))")
    b.add_argument("--force", action="store_true", help="replace an existing --out directory")
    b.set_defaults(func=_run_bandit)


def _register_multiselect(sub: argparse._SubParsersAction) -> None:
    from eval import multiselect_data as data
    from eval import multiselect_theory as theory

    def grid(values: tuple[float, ...]) -> str:
        return " ".join(f"{v:g}" for v in values)

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
    mode.add_argument("--theory", action="store_true", help="the 1-D theory")
    mode.add_argument(
        "--artifacts",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="evaluate on these artifacts' test users (built by `recsvc prep`, with a client bundle)",
    )
    m.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default: results/multiselect with --theory, results/multiselect-datasets "
        "with --artifacts)",
    )
    m.add_argument(
        "--ks",
        nargs="+",
        type=int,
        default=None,
        metavar="K",
        help=f"numbers of results k (default: {grid(theory.DEFAULT_KS)} with --theory, "
        f"{grid(data.DEFAULT_KS)} with --artifacts)",
    )
    m.add_argument(
        "--epsilons",
        nargs="+",
        type=float,
        default=None,
        metavar="EPS",
        help=f"ε values (default: {grid(theory.DEFAULT_EPSILONS)} with --theory, "
        f"{grid(data.DEFAULT_EPSILONS)} with --artifacts)",
    )
    m.add_argument(
        "--mc-draws", type=int, default=theory.DEFAULT_MC_DRAWS, help="--theory: Monte Carlo draws per (k, ε)"
    )
    m.add_argument(
        "--users",
        type=int,
        default=None,
        help="--artifacts: only the first N test users of each artifact (default: all)",
    )
    m.add_argument(
        "--trials",
        type=int,
        default=data.DEFAULT_TRIALS,
        help="--artifacts: device signals (and central selections) per user and ε",
    )
    m.add_argument("--workers", type=int, default=None, help="--artifacts: worker processes (default: min(2, cores))")
    m.add_argument("--chunk-size", type=int, default=data.DEFAULT_CHUNK, help="--artifacts: users per work unit")
    m.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed; --theory: row i draws from SeedSequence(seed, spawn_key=(i,)); --artifacts: user b from "
        "SeedSequence(seed, spawn_key=(b, …))",
    )
    m.add_argument("--force", action="store_true", help="replace an existing --out directory")
    m.set_defaults(func=_run_multiselect)


def _run_multiselect(args: argparse.Namespace) -> int:
    from eval import multiselect_data as data
    from eval import multiselect_theory as theory

    if args.theory:
        out = Path("results/multiselect") if args.out is None else args.out
        ks = theory.DEFAULT_KS if args.ks is None else tuple(args.ks)
        eps = theory.DEFAULT_EPSILONS if args.epsilons is None else tuple(args.epsilons)
        cfg = theory.TheoryConfig(out, ks, eps, args.mc_draws, args.seed, args.force)
        print(theory.summary(theory.run_theory(cfg)))
        return 0
    from eval.multiselect_run import run_datasets, summary

    dcfg = data.DatasetConfig(
        artifacts=tuple(args.artifacts),
        out=Path("results/multiselect-datasets") if args.out is None else args.out,
        users=args.users,
        ks=data.DEFAULT_KS if args.ks is None else tuple(args.ks),
        epsilons=data.DEFAULT_EPSILONS if args.epsilons is None else tuple(args.epsilons),
        trials=args.trials,
        seed=args.seed,
        workers=args.workers,
        chunk_size=args.chunk_size,
        force=args.force,
    )
    print(summary(run_datasets(dcfg)))
    return 0


def _config(args: argparse.Namespace, **source):
    from eval.config import DEFAULT_EPSILONS, EvalConfig
    from eval.pipelines import DEFAULT_M, DEFAULT_SLATE_K

    slate_k = getattr(args, "slate_k", None)
    m = getattr(args, "two_stage_m", None)
    return EvalConfig(
        pipelines=tuple(getattr(args, "pipelines", ())),
        slate_k=tuple(slate_k) if slate_k else DEFAULT_SLATE_K,
        two_stage_m=DEFAULT_M if m is None else m,
        two_stage_trials=getattr(args, "two_stage_trials", None),
        **source,
        users=args.users,
        mechanisms=tuple(args.mechanisms) if args.mechanisms else None,
        epsilons=tuple(args.epsilons) if args.epsilons else DEFAULT_EPSILONS,
        trials=args.trials,
        seed=args.seed,
        exact=args.exact,
        params=params_from_namespace(args),
        engine=args.engine,
        workers=args.workers,
        scheduler=args.scheduler,
        chunk_size=args.chunk_size,
        out=args.out,
        ratio_epsilon=args.ratio_epsilon,
        force=args.force,
    )


def _finish(result) -> int:
    from eval.outputs import summary

    text, _ = summary(result)
    print(text)
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
    from eval.run import run

    if args.out is None:
        # The dataset name comes from the manifest when it is readable; the folder name otherwise.
        args.out = Path("results") / args.artifacts.resolve().name
    return _finish(run(_config(args, artifacts=args.artifacts)))


def _run_synthetic(args: argparse.Namespace) -> int:
    from eval.config import DEFAULT_LEVEL, level_dirname
    from eval.run import run
    from eval.sweep import run_sweep

    level = _level(args.level)
    if args.scenario == "proportion":
        return _run_proportion(args, level)
    if isinstance(level, str):  # "all"
        if args.out is None:
            args.out = Path("results") / f"scenario-{args.scenario}"
        return _finish(run_sweep(_config(args, scenario=args.scenario, n=args.n, level=None)))
    if args.out is None:
        suffix = f"-{level_dirname(DEFAULT_LEVEL if level is None else level)}" if args.scenario == "sweep" else ""
        args.out = Path("results") / f"scenario-{args.scenario}{suffix}"
    return _finish(run(_config(args, scenario=args.scenario, n=args.n, level=level)))


def _run_bandit(args: argparse.Namespace) -> int:
    from eval.bandit.config import BanditConfig
    from eval.bandit.report import summary_text
    from eval.bandit.run import run

    result = run(
        BanditConfig(
            out=args.out,
            seeds=args.seeds,
            horizon=args.horizon,
            shift=args.shift,
            workers=args.workers,
            force=args.force,
        )
    )
    print(summary_text(result))
    return 0


def _run_proportion(args: argparse.Namespace, level: float | str | None) -> int:
    from eval.proportion import run_proportion

    if args.out is None:
        args.out = Path("results") / "scenario-proportion"
    res = run_proportion(_config(args, scenario="proportion", n=args.n, level=level))
    held = sum(f.holds for f in res.findings)
    print(
        f"proportion of high scores (Figure 18) at ε = {res.epsilon:g}: {held} of {len(res.findings)} of the "
        f"paper's statements hold ({res.seconds:.1f} s)"
    )
    for f in res.findings:
        print(f"  [{'yes' if f.holds else 'NO '}] {f.statement}: {f.detail}")
    if res.out is not None:
        print(f"report: {res.out / 'report.md'}")
    return 0


def _run_two_candidates(args: argparse.Namespace) -> int:
    from eval.two_candidate_run import run_two_candidates
    from eval.two_candidates import TwoCandidateConfig

    res = run_two_candidates(
        TwoCandidateConfig(
            out=args.out,
            deltas=tuple(args.deltas),
            epsilons=tuple(args.epsilons),
            gaps=tuple(args.gaps),
            gammas=tuple(args.gammas),
            beta=args.beta,
            force=args.force,
        )
    )
    held = sum(f.holds for f in res.findings)
    print(
        f"two candidates: {res.table.height} HG values in {res.seconds:.1f} s; "
        f"{held} of {len(res.findings)} of the paper's statements hold"
    )
    for f in res.findings:
        print(f"  [{'yes' if f.holds else 'NO '}] {f.statement}: {f.detail}")
    if res.out is not None:
        print(f"report: {res.out / 'report.md'}")
    return 0
