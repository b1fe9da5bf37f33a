"""Benchmark of the evaluation harness (BENCHMARKS.md § Evaluation).

1. users/s per private mechanism over the whole ε grid (1 worker, a subset of users);
2. the noise floor: the time only to create each user's stream and draw a (trials × n) noise
   matrix per mechanism × ε, and the ratio of the harness's time to it (target ≤ 3×);
3. the speed-up of 2 local worker processes over 1 on the same users;
4. the full default grid (11 ε × every private mechanism × 50 trials) on 10,000 users with
   2 workers (target < 15 min).

Data: ``--artifacts`` (default ``artifacts/synthetic-ml20m-shape``, built by the data_prep
benchmark). If it does not exist, a candidate set with the same shape (20,720 items, 500
candidates per test user, power-law popularity, Δ and scores increasing with popularity) is
written with ArtifactWriter to ``artifacts/bench-eval-ml20m-shape`` and used instead.

    .venv/bin/python -m scripts.bench.eval [--users 10000] [--subset 200] [--speedup-users 1000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import polars as pl

from eval.evaluation.config import DEFAULT_EPSILONS, DEFAULT_TRIALS, EvalConfig
from eval.evaluation.results import EvalResult
from eval.evaluation.run import run
from eval.evaluation.sources import ArtifactSource
from eval.evaluation.work import evaluate_chunk, make_context
from recsvc.artifact import ArtifactWriter, load_artifact
from recsvc.mechanisms import MECHANISMS
from recsvc.rng import user_stream

ML20M_ITEMS = 20_720
CANDIDATES = 500


def build_fallback(out: Path, users: int, items: int = ML20M_ITEMS, n: int = CANDIDATES, seed: int = 0) -> Path:
    """A candidate set with ml20m's shape, written through the real ArtifactWriter."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, items + 1) ** 0.8  # power-law item popularity
    sens = 0.02 + 0.5 * (pop / pop.max()) ** 0.3  # popular items: wider score range (as with SANSA)
    lo = rng.uniform(-0.01, 0.0, items)
    hi = lo + sens
    item_ids = np.array([f"m{k}" for k in range(items)])
    logp = np.log(pop)
    picks, scores = [], []
    for start in range(0, users, 500):  # Gumbel top-n: n distinct items per user, ∝ popularity
        b = min(500, users - start)
        keys = logp + rng.gumbel(size=(b, items))
        idx = np.argpartition(-keys, n, axis=1)[:, :n]
        s = lo[idx] + sens[idx] * rng.beta(2.0, 3.0, (b, n)) * 1.15  # a few above hi: clipping matters
        order = np.argsort(-s, axis=1)
        picks.append(np.take_along_axis(idx, order, 1))
        scores.append(np.take_along_axis(s, order, 1))
    idx, s = np.concatenate(picks), np.concatenate(scores)
    cands = pl.DataFrame(
        {
            "user_id": np.repeat(np.array([f"u{u:06d}" for u in range(users)]), n),
            "rank": np.tile(np.arange(n, dtype=np.int32), users),
            "item_id": item_ids[idx.ravel()],
            "score": s.ravel(),
        }
    )
    with ArtifactWriter(out, force=True) as w:
        w.write_items(pl.DataFrame({"item_id": item_ids, "lo": lo, "hi": hi, "sensitivity": np.maximum(hi - lo, 1e-6)}))
        w.write_candidates(cands)
        return w.commit(
            {
                "dataset": "bench-eval-ml20m-shape",
                "seed": seed,
                "note": "eval benchmark fallback: synthetic candidates with ml20m's shape",
            }
        )


def noise_floor(art_path: Path, users: int, mechanisms: list[str], trials: int) -> float:
    """Seconds to only create each user's stream and draw its noise, per mechanism × ε."""
    n = load_artifact(art_path, verify=False).candidate_matrix(users=1).scores.shape[1]
    t = time.perf_counter()
    for _ in mechanisms:
        for _eps in DEFAULT_EPSILONS:
            for b in range(users):
                user_stream(0, b).standard_exponential((trials, n))
    return time.perf_counter() - t


def timed(cfg: EvalConfig) -> tuple[float, EvalResult]:
    t = time.perf_counter()
    res = run(cfg)
    return time.perf_counter() - t, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/synthetic-ml20m-shape"))
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--subset", type=int, default=200, help="users for the per-mechanism and floor timings")
    ap.add_argument("--speedup-users", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    ap.add_argument("--json", type=Path, default=Path("results/bench_eval.json"))
    args = ap.parse_args()

    source = "data_prep artifact"
    art = args.artifacts
    if not (art / "manifest.json").is_file():
        art = Path("artifacts/bench-eval-ml20m-shape")
        source = "eval fallback (ArtifactWriter, ml20m shape)"
        if (art / "manifest.json").is_file() and len(load_artifact(art).user_ids) >= args.users:
            print(f"reusing fallback artifact {art}", flush=True)
        else:
            t = time.perf_counter()
            build_fallback(art, args.users)
            print(f"built fallback artifact {art} in {time.perf_counter() - t:.1f} s", flush=True)
    mechs = [m for m, o in MECHANISMS.items() if o.private]
    base = dict(artifacts=art, epsilons=DEFAULT_EPSILONS, trials=args.trials, seed=0, progress=False)

    # The work unit itself on one prebuilt chunk: steady-state throughput without the one-off
    # artifact load (sha256 + Parquet read + sort), which the end-to-end timings below include.
    chunk = ArtifactSource(art, args.subset).chunk(range(args.subset))
    per_mech = {}
    for m in mechs:
        ctx = make_context(EvalConfig(**base, mechanisms=(m,)), (m,))
        t = time.perf_counter()
        evaluate_chunk(chunk, ctx)
        per_mech[m] = args.subset / (time.perf_counter() - t)
        print(f"{m:14s} {per_mech[m]:8.1f} users/s (11 ε × {args.trials} trials, 1 worker)", flush=True)
    t = time.perf_counter()
    evaluate_chunk(chunk, make_context(EvalConfig(**base), tuple(mechs)))
    unit = time.perf_counter() - t
    grid_1w, _ = timed(EvalConfig(**base, users=args.subset, workers=1))
    floor = noise_floor(art, args.subset, mechs, args.trials)
    print(
        f"{args.subset} users, all mechanisms, 1 worker: work unit {unit:.1f} s, end-to-end {grid_1w:.1f} s; "
        f"noise floor {floor:.1f} s; ratios {unit / floor:.2f}× / {grid_1w / floor:.2f}×",
        flush=True,
    )

    one, _ = timed(EvalConfig(**base, users=args.speedup_users, workers=1))
    two, _ = timed(EvalConfig(**base, users=args.speedup_users, workers=2))
    print(
        f"{args.speedup_users} users: 1 worker {one:.1f} s, 2 workers {two:.1f} s, speed-up {one / two:.2f}×",
        flush=True,
    )

    full, res = timed(
        EvalConfig(
            **{**base, "progress": True}, users=args.users, workers=2, out=Path("results") / "bench-eval", force=True
        )
    )
    print(
        f"full grid: {res.users} users × {len(mechs)} mechanisms × 11 ε × {args.trials} trials, 2 workers: "
        f"{full:.1f} s = {full / 60:.1f} min ({res.users / full:.1f} users/s)",
        flush=True,
    )
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "source": source,
        "artifact": str(art),
        "users": res.users,
        "per_mechanism_users_per_s": per_mech,
        "subset": args.subset,
        "grid_subset_s": grid_1w,
        "work_unit_s": unit,
        "noise_floor_s": floor,
        "floor_ratio_unit": unit / floor,
        "floor_ratio_end_to_end": grid_1w / floor,
        "speedup_users": args.speedup_users,
        "one_worker_s": one,
        "two_workers_s": two,
        "speedup": one / two,
        "full_grid_s": full,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
