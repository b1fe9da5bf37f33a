"""``recsvc prep``: build an artifact directory (see recsvc/app/cli.py for the registration contract)."""

from __future__ import annotations

import argparse
from pathlib import Path

from data_prep.config import BundleConfig, PolicyConfig, PrepConfig
from recsvc.settings import add_argument, add_arguments, from_namespace, settings_of

# --help's sections of `recsvc prep`: each opens at its first setting and runs to the next one.
SECTIONS = {
    "preset": "synthetic data (only with --dataset synthetic)",
    "test_users": "split sizes (default: the dataset's)",
    "engine": "execution",
    "policy_users": "`auto` policy table (policy.parquet; see `recsvc policy`)",
    "embedding_dim": "multi-selection (client/ bundle and multiselect/ population prototypes)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prep",
        help="offline pipeline: data → SANSA → accuracy, candidates, sensitivities → artifacts/<dataset>",
        description="Load and split a dataset, fit SANSA on the training users, report accuracy on the "
        "test users, write their top-500 candidates and per-item sensitivities from a user population.",
    )
    section: argparse.ArgumentParser | argparse._ArgumentGroup = p
    for d in settings_of(PrepConfig):
        if d.name in SECTIONS:
            section = p.add_argument_group(SECTIONS[d.name])
        add_argument(section, d)
    p.set_defaults(func=run_prep)

    q = sub.add_parser(
        "policy",
        help="rebuild the `auto` policy table (policy.parquet) of an existing artifact",
        description="Expected MSE of every private mechanism of the registry's default set for each ε of the policy grid and k ∈ {1, 5, 10} "
        "on the artifact's public population (population.parquet), ranked; the artifact is replaced atomically.",
    )
    add_arguments(q, PolicyConfig)
    q.set_defaults(func=run_policy)

    b = sub.add_parser(
        "serving-bundle",
        help="copy the public files `recsvc serve` needs out of an artifact, leaving every per-user file",
        description="Write the serving bundle of an artifact: items.parquet (per-item ranges and Δ), the "
        "model, the `auto` policy table and the multi-selection client bundle, with a manifest of their own. "
        "The test users' candidates and histories and the population's scores stay behind: serve a host "
        "from the bundle so it never holds them.",
    )
    add_arguments(b, BundleConfig)
    b.set_defaults(func=run_serving_bundle)


def run_prep(args: argparse.Namespace) -> int:
    from data_prep.pipeline import run

    out = run(from_namespace(PrepConfig, args, verbose=args.verbose))
    print_summary(out)
    return 0


def run_policy(args: argparse.Namespace) -> int:
    from data_prep.rebuild_policy import rebuild

    cfg: PolicyConfig = from_namespace(PolicyConfig, args)
    out = rebuild(cfg.artifacts, users=cfg.users, trials=cfg.trials, seed=cfg.seed, workers=cfg.workers)
    print_policy(out)
    print(f"artifact: {out}")
    return 0


def run_serving_bundle(args: argparse.Namespace) -> int:
    from recsvc.artifact import load_artifact, write_serving_bundle

    cfg: BundleConfig = from_namespace(BundleConfig, args)
    out = write_serving_bundle(cfg.artifacts, cfg.out, force=cfg.force)
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
