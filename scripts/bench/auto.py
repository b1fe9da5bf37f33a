"""Report on the `auto` policy (BENCHMARKS.md § auto policy, README § `auto`): for artifacts and
synthetic scenarios, auto's expected MSE against the oracle (the best fixed private mechanism chosen
on the evaluated users themselves) at every ε of the evaluation grid, the sign rule's choice, and
combined_gem (which spends a share of ε to choose per user) against auto.

Expected MSEs come from :func:`recsvc.policy.population_mse` on the evaluated users (exact where a
mechanism has a cheap exact expectation, Monte Carlo otherwise), with other streams than the
policy table's. An artifact's table is its policy.parquet (built from the sensitivity population);
a scenario's comes from an independent draw of its population (:mod:`eval.evaluation.auto`).

    .venv/bin/python -m scripts.bench.auto --artifacts artifacts/ml-100k [--users 2000] \
        [--scenarios 1 2 4 5 7 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from eval.evaluation.auto import plan, scenario_matrix
from eval.evaluation.config import EvalConfig
from eval.evaluation.run import with_data_defaults
from eval.evaluation.sources import ScenarioSource
from recsvc.artifact import load_artifact
from recsvc.engines import LocalEngine
from recsvc.policy import AUTO, EVALUATION_EPSILONS, PolicySpec, PolicyTable, population_mse, resolve_auto, sample_users

TARGET = 1.05


def sign_rule(rho: float | None) -> str:
    return resolve_auto(rho) or "-"


def report(name: str, matrix, resolve, rho: float | None, trials: int, workers: int, params: dict) -> dict:
    """``params``: the mechanism parameters the table used (random stopping's γ for the data)."""
    t0 = time.perf_counter()
    spec = PolicySpec(epsilons=EVALUATION_EPSILONS, ks=(1,), trials=trials, seed=12345, params=params)
    inner, mse, users = population_mse(matrix, spec, LocalEngine(workers), desc=f"oracle {name}")
    names = list(spec.mechanisms)
    others = [i for i, m in enumerate(names) if m != "combined_gem"]  # mechanisms that do not choose per user
    sign = sign_rule(rho)
    rows = []
    for ei, eps in enumerate(inner.tolist()):
        col = mse[:, ei]
        best = int(np.argmin(col))
        other = others[int(np.argmin(col[others]))]
        choice = resolve(eps)
        rows.append(
            {
                "epsilon": eps,
                "auto": choice,
                "auto_mse": col[names.index(choice)],
                "oracle": names[best],
                "oracle_mse": col[best],
                "regret": 1.0 if col[names.index(choice)] == col[best] else col[names.index(choice)] / col[best],
                "sign_rule": sign,
                "sign_rule_regret": col[names.index(sign)] / col[best] if sign != "-" else None,
                "combined_gem_mse": col[names.index("combined_gem")],
                "combined_gem_vs_auto": col[names.index("combined_gem")] / col[names.index(choice)],
                "best_other": names[other],
                "combined_gem_vs_best_other": col[names.index("combined_gem")] / col[other],
            }
        )
    out = {
        "name": name,
        "users": users,
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
        "worst_regret": max(r["regret"] for r in rows),
        "combined_gem_beats_auto_at": [r["epsilon"] for r in rows if r["combined_gem_vs_auto"] < 1.0],
        "combined_gem_beats_every_other_at": [r["epsilon"] for r in rows if r["combined_gem_vs_best_other"] < 1.0],
    }
    print(f"\n## {name}: {users} users ({out['seconds']} s)\n")
    print(
        "| ε | auto → | auto MSE | oracle | oracle MSE | regret | sign rule → (regret) | combined_gem MSE (÷ auto) "
        "| best other (combined_gem ÷ it) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sr = f"{r['sign_rule']} ({r['sign_rule_regret']:.2f}×)" if r["sign_rule_regret"] is not None else "-"
        print(
            f"| {r['epsilon']:g} | {r['auto']} | {r['auto_mse']:.4g} | {r['oracle']} | {r['oracle_mse']:.4g} | "
            f"{r['regret']:.3f} | {sr} | {r['combined_gem_mse']:.4g} ({r['combined_gem_vs_auto']:.2f}×) | "
            f"{r['best_other']} ({r['combined_gem_vs_best_other']:.3f}×) |"
        )
    met = "met" if out["worst_regret"] <= TARGET else "NOT met"
    print(
        f"\nworst regret {out['worst_regret']:.3f} (target ≤ {TARGET}: {met}); combined_gem beats auto at "
        f"ε ∈ {out['combined_gem_beats_auto_at'] or 'none'}, every mechanism that does not choose per user at "
        f"ε ∈ {out['combined_gem_beats_every_other_at'] or 'none'}"
    )
    return out


def slate_check(
    name: str, matrix, table: PolicyTable, ks: tuple[int, ...], epsilons: tuple[float, ...], users: int, trials: int
) -> list[dict]:
    """Does ranking slates by their FIRST item (the table's k rows) pick the mechanism with the
    lowest mean slate MSE, (1/k) Σ_i (q_(i) − q_{s_i})² with q_(i) the i-th best score? Monte Carlo
    with select_slate on ``users`` users × ``trials`` slates per mechanism, k and ε."""
    from recsvc.mechanisms import select_slate
    from recsvc.policy import policy_mechanisms
    from recsvc.rng import user_stream

    q_all, d_all = matrix.clipped(), matrix.sensitivity
    pick = sample_users(len(matrix.user_ids), users, 1)
    rows = []
    print(f"\n### {name}: slates, first-item ranking vs mean slate MSE ({len(pick)} users × {trials} slates)\n")
    print("| k | ε | table (first item) → | lowest mean slate MSE | its slate MSE | table's choice ÷ it |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        for eps in epsilons:
            mse = {}
            for m in policy_mechanisms():
                vals = []
                for b in pick.tolist():
                    c = int(matrix.count[b])
                    q, d = q_all[b, :c], d_all[b, :c]
                    best = np.sort(q)[::-1][:k]
                    rng = user_stream(7, b)
                    for _ in range(trials):
                        s = select_slate(m, q, d, eps, k, rng)
                        vals.append(float(np.mean((best - q[s]) ** 2)))
                mse[m] = float(np.mean(vals))
            choice, top = table.resolve(eps, k), min(mse, key=mse.__getitem__)
            rows.append(
                {
                    "k": k,
                    "epsilon": eps,
                    "table": choice,
                    "slate_best": top,
                    "ratio": mse[choice] / mse[top] if mse[top] > 0 else 1.0,
                }
            )
            print(f"| {k} | {eps:g} | {choice} | {top} | {mse[top]:.4g} | {rows[-1]['ratio']:.3f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, nargs="*", default=[], help="artifact directories with policy.parquet")
    ap.add_argument("--users", type=int, default=None, help="at most this many test users (seeded sample)")
    ap.add_argument("--scenarios", nargs="*", default=[], help="synthetic scenarios, e.g. 1 2 4 5 7 8")
    ap.add_argument(
        "--trials", type=int, default=100, help="Monte Carlo selections per user (rs, rs_improved, rnm_laplace)"
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--slates",
        action="store_true",
        help="also check the slate (k > 1) rows against the mean slate MSE (Monte Carlo, slow)",
    )
    args = ap.parse_args()
    results = []
    for path in args.artifacts:
        art = load_artifact(path)
        if art.policy is None:
            ap.error(
                f"{path} has no policy.parquet; expected an artifact built by `recsvc prep` (it writes `auto`'s "
                "policy table)"
            )
        table = PolicyTable.from_frame(art.policy)
        matrix = art.candidate_matrix()
        if args.users is not None and args.users < len(matrix.user_ids):
            matrix = matrix.take(sample_users(len(matrix.user_ids), args.users, 0))
        rho = art.manifest.population_spearman.median if art.manifest.population_spearman else None
        params = dict(art.manifest.policy.params) if art.manifest.policy is not None else {}
        results.append(
            report(f"{art.manifest.dataset} ({path})", matrix, table.resolve, rho, args.trials, args.workers, params)
        )
        if args.slates:
            results[-1]["slates"] = slate_check(
                art.manifest.dataset, matrix, table, (5, 10), (0.5, 4.0, 16.0), users=50, trials=20
            )
    for name in args.scenarios:
        source = ScenarioSource(name, 100, None, 0, None)
        cfg = with_data_defaults(
            EvalConfig(scenario=name, mechanisms=(AUTO,), epsilons=EVALUATION_EPSILONS, seed=0, progress=False), source
        )  # γ 0.05 on synthetic data, as eval runs it
        assert cfg.mechanisms is not None  # (AUTO,), as given
        auto = plan(cfg, cfg.mechanisms, source)
        rho = float(np.median(source.sc.correlation()))  # the sign rule reads the population's median ρ
        trials = max(args.trials, 20_000 // source.total)
        results.append(
            report(
                f"scenario {name}",
                scenario_matrix(source.sc),
                auto.resolved.__getitem__,
                rho,
                trials,
                args.workers,
                {"gamma": cfg.params["gamma"]},
            )
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
