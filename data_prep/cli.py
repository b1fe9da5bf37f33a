"""``recsvc prep``: build an artifact directory (see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from pathlib import Path

from data_prep import DATASETS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prep",
        help="offline pipeline: data → SANSA → accuracy, candidates, sensitivities → artifacts/<dataset>",
        description="Load and split a dataset, fit SANSA on the training users, report accuracy on the "
        "test users, write their top-500 candidates and per-item sensitivities from a user population.",
    )
    p.add_argument("--dataset", choices=DATASETS, default="ml-100k", help="default: ml-100k (embedded copy)")
    p.add_argument("--data-dir", type=Path, help="directory with the dataset's original files")
    p.add_argument("--out", type=Path, help="artifact directory (default artifacts/<dataset>)")
    p.add_argument("--force", action="store_true", help="replace an existing artifact directory")
    p.add_argument("--seed", type=int, default=42, help="non-negative integer (default 42)")
    p.add_argument(
        "--sensitivity-population",
        choices=("validation", "test"),
        default=None,
        help="users whose scores give the clip ranges: validation (default) or test (the paper); "
        "amazon-book always uses a sample (--population-users)",
    )
    p.add_argument("--percentiles", type=float, nargs=2, default=(1.0, 99.0), metavar=("LO", "HI"))
    p.add_argument("--l2", type=float, nargs="+", help="SANSA l2; several values → chosen on validation users")
    p.add_argument("--density", type=float, nargs="+", help="SANSA factor density; several → chosen on validation")
    p.add_argument("--factorizer", choices=("cholmod", "icf"), help="default: the dataset's paper setting")
    syn = p.add_argument_group("synthetic data (only with --dataset synthetic)")
    syn.add_argument("--preset", help="netflix-shape | ml20m-shape | small | tiny (default small)")
    syn.add_argument("--users", type=int, help="override the preset's user count (≥ 1)")
    syn.add_argument("--items", type=int, help="override the preset's item count (≥ 20)")
    syn.add_argument("--interactions", type=int, help="override the preset's interaction count (≥ 5 × users)")
    split = p.add_argument_group("split sizes (default: the dataset's)")
    split.add_argument("--test-users", type=int)
    split.add_argument("--val-users", type=int)
    split.add_argument(
        "--population-users",
        type=int,
        help="amazon-book only: size of the sensitivity sample of training users (default 10000)",
    )
    eng = p.add_argument_group("execution")
    eng.add_argument("--engine", choices=("local", "dask"), help="default: dask with --scheduler, else local")
    eng.add_argument("--workers", type=int, help="≥ 1 (default: min(2, CPUs))")
    eng.add_argument(
        "--scheduler",
        help="Dask scheduler address, e.g. tcp://HOST:8786 (implies --engine dask; "
        "refused with --engine local); connected before any work starts",
    )
    eng.add_argument("--chunk-users", type=int, default=1000)
    eng.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="refuse, before writing anything, a run estimated to need more memory than SIZE "
        "(e.g. 12GiB; default: no limit)",
    )
    pol = p.add_argument_group("`auto` policy table (policy.parquet; see `recsvc policy`)")
    pol.add_argument(
        "--policy-users",
        type=int,
        default=1000,
        help="population users it averages over: a seeded sample of larger populations (default 1000)",
    )
    pol.add_argument(
        "--policy-trials",
        type=int,
        default=50,
        help="Monte Carlo selections per user for rs, rs_improved, rnm_laplace (default 50)",
    )
    ms = p.add_argument_group("multi-selection (client/ bundle and multiselect/ population prototypes)")
    ms.add_argument(
        "--embedding-dim",
        type=int,
        default=None,
        help="d of the public embedding, < min(training users, items) (default 32, or min − 1 on a smaller dataset)",
    )
    ms.add_argument(
        "--multiselect-users",
        type=int,
        default=5000,
        help="training users sampled for the server's population (seeded; default 5000)",
    )
    ms.add_argument(
        "--multiselect-group",
        type=int,
        default=5,
        help="least training users per population prototype, ≥ 2: no row of multiselect/ is one user's (default 5)",
    )
    ms.add_argument(
        "--multiselect-top",
        type=int,
        default=100,
        help="top items by mean SANSA score kept per population prototype (default 100)",
    )
    p.set_defaults(func=run_prep)

    q = sub.add_parser(
        "policy",
        help="rebuild the `auto` policy table (policy.parquet) of an existing artifact",
        description="Expected MSE of every private mechanism of the registry's default set for each ε of the policy grid and k ∈ {1, 5, 10} "
        "on the artifact's public population (population.parquet), ranked; the artifact is replaced atomically.",
    )
    q.add_argument("--artifacts", required=True, type=Path, help="artifact directory, e.g. artifacts/ml-100k")
    q.add_argument(
        "--users", type=int, default=1000, help="population users to average over (seeded sample; default 1000)"
    )
    q.add_argument(
        "--trials",
        type=int,
        default=50,
        help="Monte Carlo selections per user for mechanisms without an exact expectation (default 50)",
    )
    q.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the sample and the Monte Carlo streams (default: the artifact's seed, as `recsvc prep` used)",
    )
    q.add_argument("--workers", type=int, help="≥ 1 (default: min(2, CPUs))")
    q.set_defaults(func=run_policy)

    b = sub.add_parser(
        "serving-bundle",
        help="copy the public files `recsvc serve` needs out of an artifact, leaving every per-user file",
        description="Write the serving bundle of an artifact: items.parquet (per-item ranges and Δ), the "
        "model, the `auto` policy table and the multi-selection client bundle, with a manifest of their own. "
        "The test users' candidates and histories and the population's scores stay behind: serve a host "
        "from the bundle so it never holds them.",
    )
    b.add_argument("--artifacts", type=Path, required=True, help="the full artifact directory `recsvc prep` wrote")
    b.add_argument("--out", type=Path, required=True, help="the bundle directory to create")
    b.add_argument("--force", action="store_true", help="replace an existing bundle directory")
    b.set_defaults(func=run_serving_bundle)


def run_prep(args: argparse.Namespace) -> int:
    from data_prep.pipeline import PrepConfig, run

    cfg = PrepConfig(
        dataset=args.dataset,
        data_dir=args.data_dir,
        out=args.out,
        force=args.force,
        seed=args.seed,
        sensitivity_population=args.sensitivity_population,
        percentiles=tuple(args.percentiles),
        l2=tuple(args.l2) if args.l2 else None,
        density=tuple(args.density) if args.density else None,
        factorizer=args.factorizer,
        preset=args.preset,
        users=args.users,
        items=args.items,
        interactions=args.interactions,
        test_users=args.test_users,
        val_users=args.val_users,
        population_users=args.population_users,
        engine=args.engine,
        workers=args.workers,
        scheduler=args.scheduler,
        chunk_users=args.chunk_users,
        policy_users=args.policy_users,
        policy_trials=args.policy_trials,
        embedding_dim=args.embedding_dim,
        multiselect_users=args.multiselect_users,
        multiselect_group=args.multiselect_group,
        multiselect_top=args.multiselect_top,
        verbose=getattr(args, "verbose", False),
        memory_limit=args.memory_limit,
    )
    out = run(cfg)
    print_summary(out)
    return 0


def run_policy(args: argparse.Namespace) -> int:
    from data_prep.policy import rebuild

    out = rebuild(args.artifacts, users=args.users, trials=args.trials, seed=args.seed, workers=args.workers)
    print_policy(out)
    print(f"artifact: {out}")
    return 0


def run_serving_bundle(args: argparse.Namespace) -> int:
    from recsvc.artifact import load_artifact, write_serving_bundle

    out = write_serving_bundle(args.artifacts, args.out, force=args.force)
    files = sorted(load_artifact(out, verify=False).manifest.files)
    print(f"serving bundle: {out} ({len(files)} files: {', '.join(files)})")
    return 0


def print_policy(out: Path) -> None:
    """The table's winners per k: what `auto` resolves to at each grid ε."""
    from recsvc.artifact import load_artifact
    from recsvc.policy import PolicyTable

    art = load_artifact(out, verify=False)
    info = art.manifest.policy
    assert art.policy is not None and info is not None
    table = PolicyTable.from_frame(art.policy)
    print(
        f"`auto` policy table: {len(table.epsilons)} ε × k ∈ {list(table.ks)} on {info.users} population users "
        f"({info.trials} Monte Carlo trials per user where no exact expectation exists)"
    )
    for k in table.ks:
        runs: list[list] = []  # [mechanism, first ε, last ε] of consecutive grid points
        for kk, e, m, _ in table.winners():
            if kk != k:
                continue
            if runs and runs[-1][0] == m:
                runs[-1][2] = e
            else:
                runs.append([m, e, e])
        print(f"  k={k}: " + ", ".join(f"{m} (ε {a:g}–{b:g})" if a != b else f"{m} (ε {a:g})" for m, a, b in runs))


def print_summary(out: Path) -> None:
    from recsvc.artifact import load_artifact

    m = load_artifact(out, verify=False).manifest
    acc, rho, s, split = m.accuracy, m.population_spearman, m.sansa, m.split
    assert acc is not None and rho is not None and s is not None and split is not None and m.timings_s is not None
    print(
        f"dataset {m.dataset}: {split.test_users} test users, {split.items} items; "
        f"SANSA l2={s.l2:g} density={s.density:g} ({s.selected_on})"
    )
    if split.kind.startswith("weak"):  # the LightGCN/BARS protocol's metrics
        print(
            f"accuracy (test users): Recall@20 (hits/|targets|) {acc['bars_recall@20']:.4f}  "
            f"nDCG@20 {acc['ndcg@20']:.4f}"
        )
    else:
        print(
            f"accuracy (test users): Recall@20 {acc['recall@20']:.4f}  Recall@50 {acc['recall@50']:.4f}  "
            f"nDCG@100 {acc['ndcg@100']:.4f}"
        )
    print(
        f"population Spearman(q, Δ) over {rho.users} {m.sensitivity_population} users: "
        f"median {rho.median:+.3f}, mean {rho.mean:+.3f}, positive {rho.frac_positive:.1%}"
    )
    if m.policy is not None:
        print_policy(out)
    print(f"artifact: {out} ({m.timings_s['total']:.1f} s)")
