"""``recsvc eval`` and ``recsvc eval-synthetic`` (see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from pathlib import Path

from recsvc.mechanisms import MECHANISMS, add_param_arguments, params_from_namespace


def _common(p: argparse.ArgumentParser) -> None:
    not_dp = ", ".join(n for n, m in MECHANISMS.items() if not m.private)
    p.add_argument("--mechanisms", nargs="+", metavar="NAME",
                   help=f"mechanisms to compare (default: every private one; {not_dp} only if named)")
    p.add_argument("--epsilons", nargs="+", type=float, metavar="EPS", default=None,
                   help="privacy parameters ε > 0 (default: 0.01 … 16, 11 values)")
    p.add_argument("--trials", type=int, default=50, help="selections per user, mechanism and ε (default 50)")
    p.add_argument("--exact", action="store_true",
                   help="expected MSE from exact probabilities; Monte Carlo (and a note) where a mechanism has none")
    p.add_argument("--seed", type=int, default=0, help="seed; user b uses SeedSequence(seed, spawn_key=(b,))")
    add_param_arguments(p)  # --beta, --gamma, --corr-budget-fraction: from the mechanisms' specs
    p.add_argument("--engine", choices=("local", "dask"), default="local")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: min(2, cores))")
    p.add_argument("--scheduler", default=None, help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="users per work unit (default: 256, smaller for small runs so each worker gets ~4)")
    p.add_argument("--ratio-epsilon", type=float, default=1.0,
                   help="ε of the mGEM/GEM log-ratio scatter plot (nearest in the grid; default 1)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out directory (never the --artifacts directory)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate selection mechanisms on an artifact's test users",
                       description="Every mechanism × ε on each test user's top candidates: MSE tables, "
                                   "correlation statistics, PNG plots and report.md.")
    p.add_argument("--artifacts", required=True, type=Path, help="artifact directory, e.g. artifacts/ml-100k")
    p.add_argument("--users", type=int, default=None, help="only the first N test users (default: all)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default: results/<dataset>)")
    _common(p)
    p.set_defaults(func=_run_eval)

    s = sub.add_parser("eval-synthetic", help="evaluate selection mechanisms on a synthetic scenario from the paper",
                       description="Scenarios: 1–3 bimodal, 4–6 realistic, 7–8 combined-GEM polarised, "
                                   "sweep (Figure 10, --level t).")
    s.add_argument("--scenario", required=True, help="1 … 8 or sweep")
    s.add_argument("--n", type=int, default=100, help="candidates (default 100)")
    s.add_argument("--users", "--repeats", dest="users", type=int, default=None,
                   help="synthetic users = score draws (default: 1 for scenarios 1–3, 1000 for 4–6, 5000 for 7–8, "
                        "100 independent instances per sweep level)")
    s.add_argument("--level", default=None,
                   help="sweep level t, only with --scenario sweep (default 0.8), or 'all': the paper's seven "
                        "(-5 -0.8 -0.3 0 0.3 0.8 5) in one results directory with sweep.csv, sweep.png, report.md")
    s.add_argument("--out", type=Path, default=None, help="results directory (default: results/scenario-NAME)")
    _common(s)
    s.set_defaults(func=_run_synthetic)


def _config(args: argparse.Namespace, **source):
    from eval.config import DEFAULT_EPSILONS, EvalConfig

    return EvalConfig(
        **source, users=args.users, mechanisms=tuple(args.mechanisms) if args.mechanisms else None,
        epsilons=tuple(args.epsilons) if args.epsilons else DEFAULT_EPSILONS, trials=args.trials, seed=args.seed,
        exact=args.exact, params=params_from_namespace(args), engine=args.engine, workers=args.workers,
        scheduler=args.scheduler, chunk_size=args.chunk_size, out=args.out, ratio_epsilon=args.ratio_epsilon,
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
    if level == "all":
        if args.out is None:
            args.out = Path("results") / f"scenario-{args.scenario}"
        return _finish(run_sweep(_config(args, scenario=args.scenario, n=args.n, level=None)))
    if args.out is None:
        suffix = f"-{level_dirname(DEFAULT_LEVEL if level is None else level)}" if args.scenario == "sweep" else ""
        args.out = Path("results") / f"scenario-{args.scenario}{suffix}"
    return _finish(run(_config(args, scenario=args.scenario, n=args.n, level=level)))
