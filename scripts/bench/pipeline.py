"""Benchmark of the offline pipeline (`recsvc prep`).

Runs the whole pipeline on `synthetic --preset ml20m-shape` (136,677 users, 20,720 items,
~10M interactions; output artifacts/synthetic-ml20m-shape, reused by the eval benchmark) and
ml-100k end-to-end, each in a subprocess. Reports wall time per step (from the manifest),
peak RSS of the whole process tree (sampled with psutil, workers included) and users scored
per second. Targets: ml20m-shape < 15 min and < 8 GiB; ml-100k < 60 s.

    .venv/bin/python -m scripts.bench.pipeline [--skip-ml20m] [--engine local|dask] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from recsvc.artifact import read_manifest

ROOT = Path(__file__).resolve().parents[2]
RECSVC = [sys.executable, "-m", "recsvc.app.cli"]


def run_measured(cmd: list[str], log: Path, cwd: Path = ROOT) -> dict[str, float]:
    """Runs ``cmd`` in ``cwd``; returns wall seconds and the peak memory of it and its descendants:
    summed PSS (shared copy-on-write pages of forked workers counted once), summed RSS, and the
    peak PSS of ``cmd``'s own process."""
    peak = peak_rss = peak_root = 0
    done = threading.Event()
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

        def sample() -> None:
            nonlocal peak, peak_rss, peak_root
            root = psutil.Process(proc.pid)
            while not done.is_set():
                pss = rss = 0
                try:
                    for p in [root, *root.children(recursive=True)]:
                        try:
                            info = p.memory_full_info()
                            pss, rss = pss + info.pss, rss + info.rss
                            if p.pid == proc.pid:
                                peak_root = max(peak_root, info.pss)
                        except psutil.Error:
                            pass
                except psutil.Error:
                    pass
                peak, peak_rss = max(peak, pss), max(peak_rss, rss)
                time.sleep(0.5)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        code = proc.wait()
        wall = time.perf_counter() - t0
        done.set()
        thread.join()
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {code}; see {log}")
    return {
        "wall_s": round(wall, 1),
        "peak_pss_gib": round(peak / 2**30, 2),
        "peak_rss_sum_gib": round(peak_rss / 2**30, 2),
        "peak_pss_main_gib": round(peak_root / 2**30, 2),
    }


def summarise(name: str, out: Path, measured: dict[str, float]) -> dict[str, Any]:
    m = read_manifest(out)
    assert m.timings_s is not None and m.split is not None and m.sansa is not None and m.population_spearman is not None
    assert m.sensitivity_population_users is not None
    t = dict(m.timings_s)
    scored = m.split.test_users + m.sensitivity_population_users
    scoring_s = t.get("test_candidates", 0) + t.get("population_scoring", 0)
    return {
        "run": name,
        **measured,
        "steps_s": t,
        "users_scored": scored,
        "users_per_s": round(scored / scoring_s, 1) if scoring_s else None,
        "accuracy": m.accuracy,
        "population_spearman_median": m.population_spearman.median,
        "sansa": {"l2": m.sansa.l2, "density": m.sansa.density, "factorizer": m.sansa.factorizer},
        "split": m.split.to_dict(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-ml20m", action="store_true")
    ap.add_argument("--engine", default="local")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "bench_pipeline.json")
    args = ap.parse_args()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    common = ["--engine", args.engine, "--workers", str(args.workers), "--force"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ml-100k"
        m = run_measured([*RECSVC, "prep", "--out", str(out), *common], args.results.with_suffix(".ml100k.log"))
        rows.append(summarise("ml-100k", out, m))
        print(json.dumps(rows[-1], indent=1), flush=True)
    if not args.skip_ml20m:
        out = ROOT / "artifacts" / "synthetic-ml20m-shape"
        cmd = [*RECSVC, "prep", "--dataset", "synthetic", "--preset", "ml20m-shape", "--out", str(out), *common]
        m = run_measured(cmd, args.results.with_suffix(".ml20m.log"))
        rows.append(summarise("synthetic ml20m-shape", out, m))
        print(json.dumps(rows[-1], indent=1), flush=True)
    args.results.write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| run | wall s | peak PSS GiB (tree) | peak RSS sum GiB | users/s scored | steps (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        steps = ", ".join(f"{k} {v:.1f}" for k, v in r["steps_s"].items() if k != "total")
        print(
            f"| {r['run']} | {r['wall_s']} | {r['peak_pss_gib']} | {r['peak_rss_sum_gib']} | {r['users_per_s']} | {steps} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
