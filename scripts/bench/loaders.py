"""Benchmark of the large loaders at full size: wall time and peak memory (PSS of the process) of
loading the Netflix Prize files and ML-20M's ratings.csv, and of turning them into the filtered
int32 matrix the split reads. Each load runs in its own process.

Files in the original formats come from scripts/bench/gen_ratings.py (targets: ML-20M's 20 M rows
in < 1 minute; Netflix's 100 M within the netflix-shape prep's 30 minutes and 12 GiB).

    .venv/bin/python -m scripts.bench.loaders --netflix data/netflix-synthetic --ml20m data/ml20m-synthetic
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench.pipeline import ROOT, run_measured


def child(dataset: str, data_dir: Path) -> None:
    from data_prep.datasets import INFO, Ratings, load
    from data_prep.split import implicit_matrix

    t0 = time.perf_counter()
    raw = load(dataset, data_dir)
    assert isinstance(raw, Ratings)
    parsed = time.perf_counter() - t0
    m = implicit_matrix(raw, INFO[dataset].explicit)
    out = {
        "ratings": int(raw.ratings.size),
        "parse_s": round(parsed, 1),
        "matrix_s": round(time.perf_counter() - t0 - parsed, 1),
        "kept": m.nnz,
        "users": len(m.user_ids),
        "items": len(m.item_ids),
    }
    print("RESULT " + json.dumps(out), flush=True)


def measure(dataset: str, data_dir: Path, log: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "scripts.bench.loaders", "--child", dataset, str(data_dir)]
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    measured = run_measured(cmd, log)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    measured["cpu_s"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)
    result = next(json.loads(line[7:]) for line in log.read_text().splitlines() if line.startswith("RESULT "))
    size = sum(p.stat().st_size for p in data_dir.iterdir() if p.is_file())
    return {
        "dataset": dataset,
        "file_gib": round(size / 2**30, 2),
        **result,
        **measured,
        "bytes_per_rating": round(measured["peak_pss_gib"] * 2**30 / result["ratings"], 1),
        "load": f"{load0:.1f}–{os.getloadavg()[0]:.1f}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--netflix", type=Path, help="directory with combined_data_1..4.txt")
    ap.add_argument("--ml20m", type=Path, help="directory with ratings.csv")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "bench_loaders.json")
    ap.add_argument("--child", nargs=2, metavar=("DATASET", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    args.results.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for dataset, d in (("ml-20m", args.ml20m), ("netflix", args.netflix)):
        if d is not None:
            rows.append(measure(dataset, d, args.results.with_suffix(f".{dataset}.log")))
            print(json.dumps(rows[-1]), flush=True)
    args.results.write_text(json.dumps(rows, indent=1) + "\n")
    print(
        "| dataset | file GiB | ratings | parse s | matrix s | wall s | CPU s | peak PSS GiB | bytes / rating | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dataset']} | {r['file_gib']} | {r['ratings']:,} | {r['parse_s']} | {r['matrix_s']} | "
            f"{r['wall_s']} | {r['cpu_s']} | {r['peak_pss_gib']} | {r['bytes_per_rating']} | {r['load']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
