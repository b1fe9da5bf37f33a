"""Benchmark of `recsvc prep` against data size: wall time and peak memory (PSS of the whole
process tree) at 1 M, 10 M, 30 M and 100 M synthetic interactions, and memory per interaction.

Each size is the netflix-shape preset scaled down in users and hold-outs (17,770 items and
Netflix's SANSA settings throughout); 100 M is the preset itself. ``--baseline-src DIR`` also
runs a size with the code in DIR (e.g. ``git archive`` of an older commit), in the same
session, for a before/after ratio.

    .venv/bin/python -m scripts.bench.prep_scale [--sizes 1e6 1e7 3e7 1e8] [--preset netflix-shape]
        [--baseline-src DIR] [--results results/bench_prep_scale.json]

Writes the JSON rows, a Markdown table on stdout and a plot next to the JSON (.png).

``--load-split PRESET [--baseline-src DIR]`` instead times only the load-and-split step (this code,
and DIR's) alternately in fresh processes (CPU seconds, wall, peak RSS), so a before/after
ratio survives a shared machine's load:

    .venv/bin/python -m scripts.bench.prep_scale --load-split ml20m-shape --baseline-src /tmp/base --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from data_prep.datasets.synthetic import PRESETS
from recsvc.artifact import read_manifest
from scripts.bench.pipeline import ROOT, run_measured


def scaled(preset: str, interactions: int) -> list[str]:
    """The prep arguments for ``preset`` scaled to ``interactions`` (users and hold-outs in proportion)."""
    base = PRESETS[preset]
    share = interactions / base.interactions
    if share >= 1:
        return ["--preset", preset]
    users = max(200, round(base.users * share))
    held = max(20, round(base.test_users * share))
    return [
        "--preset",
        preset,
        "--users",
        str(users),
        "--interactions",
        str(interactions),
        "--test-users",
        str(held),
        "--val-users",
        str(held),
    ]


def run_one(src: Path, args: list[str], out: Path, log: Path, workers: int) -> dict[str, Any]:
    # -P: the code comes from PYTHONPATH (src), not from the working directory
    cmd = [sys.executable, "-P", "-m", "recsvc.app.cli", "prep", "--dataset", "synthetic", *args]
    cmd += ["--out", str(out), "--force", "--workers", str(workers)]
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src)
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        measured = run_measured(cmd, log)
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env_path
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the whole tree (workers included): on a shared machine, the wall time's
    # lower bound on a quiet one is about cpu_s / cores used.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    m = read_manifest(out)
    assert m.split is not None and m.timings_s is not None
    sp = m.split
    val_in = sp.validation_input_interactions or 0
    # The manifest has no validation-target count: the test users' target share estimates it.
    val_tg = round(val_in * sp.test_target_interactions / max(sp.test_input_interactions, 1))
    nnz = sp.train_interactions + sp.test_input_interactions + sp.test_target_interactions + val_in + val_tg
    users = sp.train_users + sp.test_users + (sp.validation_users or 0)
    return {
        "command": " ".join(["recsvc", "prep", "--dataset", "synthetic", *args, "--workers", str(workers)]),
        "src": str(src),
        "baseline": src != ROOT,
        "users": users,
        "interactions_kept": nnz,
        **measured,
        "cpu_s": round(cpu, 1),
        "bytes_per_interaction": round(measured["peak_pss_gib"] * 2**30 / max(nnz, 1), 1),
        "steps_s": dict(m.timings_s),
        "load_at_start": round(load0, 1),
        "load_at_end": round(os.getloadavg()[0], 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


LOAD_SPLIT_CHILD = """
import json, resource, sys, time
from data_prep import pipeline
assert pipeline.__file__.startswith(sys.argv[2]), pipeline.__file__
from data_prep.config import PrepConfig
cfg = PrepConfig(dataset="synthetic", preset=sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
split, _, _ = pipeline._load_and_split(cfg, pipeline.datasets.INFO["synthetic"])
print(json.dumps({"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
    "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    "train_interactions": int(split.train.nnz)}))
"""


def load_split(preset: str, baseline: Path | None, repeats: int) -> list[dict[str, Any]]:
    """The load-and-split step alone, this code and ``baseline``'s alternately, each in a fresh process."""
    import subprocess

    rows = []
    for _ in range(repeats):
        for src in (ROOT, baseline) if baseline else (ROOT,):
            env = {**os.environ, "PYTHONPATH": str(src)}
            out = subprocess.run(
                [sys.executable, "-P", "-c", LOAD_SPLIT_CHILD, preset, str(src)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            row = {"code": "this" if src == ROOT else "baseline", "load": round(os.getloadavg()[0], 1)}
            rows.append({**row, **json.loads(out.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = sorted((r for r in rows if not r.get("baseline")), key=lambda r: r["interactions_kept"])
    x = [r["interactions_kept"] / 1e6 for r in mine]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, label in (
        (axes[0], "wall_s", "wall time (s)"),
        (axes[1], "peak_pss_gib", "peak PSS of the process tree (GiB)"),
        (axes[2], "bytes_per_interaction", "peak PSS per interaction (bytes)"),
    ):
        ax.plot(x, [r[key] for r in mine], "o-")
        ax.set_xscale("log")
        ax.set_xlabel("interactions kept (millions)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")  # the fit's fixed cost dominates small runs
    axes[1].axhline(12, color="red", lw=0.8, ls="--", label="12 GiB target")
    axes[1].legend(fontsize=8)
    fig.suptitle("recsvc prep on netflix-shape synthetic data, scaled", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| code | interactions | users | wall s | CPU s | peak PSS GiB | bytes / interaction | load_split s | fit s | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["steps_s"]
        who = "baseline" if r.get("baseline") else "this"
        lines.append(
            f"| {who} | {r['interactions_kept']:,} | {r['users']:,} | {r['wall_s']} | {r.get('cpu_s', '')} | "
            f"{r['peak_pss_gib']} | "
            f"{r['bytes_per_interaction']} | {s.get('load_split', 0):.1f} | {s.get('fit', 0):.1f} | "
            f"{r['load_at_start']}–{r['load_at_end']} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 3e7, 1e8], help="interactions")
    ap.add_argument("--preset", default="netflix-shape")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--baseline-src", type=Path, help="also run the sizes with the code in this directory")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "bench_prep_scale.json")
    ap.add_argument("--keep", type=Path, help="keep the largest artifact here (e.g. for eval and serve)")
    ap.add_argument("--load-split", metavar="PRESET", help="time only load and split (and --baseline-src's)")
    ap.add_argument("--repeats", type=int, default=2, help="with --load-split: alternating runs of each (default 2)")
    ap.add_argument("--merge", type=Path, nargs="+", help="only table and plot the rows of these result files")
    args = ap.parse_args()
    if args.merge:  # sizes measured in separate runs (e.g. the 100 M one started early)
        merged = [row for f in args.merge for row in json.loads(f.read_text())]
        plot(merged, args.results.with_suffix(".png"))
        args.results.write_text(json.dumps(merged, indent=1) + "\n")
        print(table(sorted(merged, key=lambda r: r["interactions_kept"])))
        return 0
    args.results.parent.mkdir(parents=True, exist_ok=True)
    if args.load_split:
        base = args.baseline_src.resolve() if args.baseline_src else None
        steps = load_split(args.load_split, base, args.repeats)
        args.results.write_text(json.dumps(steps, indent=1) + "\n")
        print("| code | wall s | CPU s | peak RSS GiB | training interactions | load |\n|---|---|---|---|---|---|")
        for r in steps:
            print(
                f"| {r['code']} | {r['wall_s']} | {r['cpu_s']} | {r['peak_rss_gib']} | {r['train_interactions']:,} | {r['load']} |"
            )
        return 0
    rows: list[dict[str, Any]] = []
    sources = [ROOT] + ([args.baseline_src.resolve()] if args.baseline_src else [])
    with tempfile.TemporaryDirectory(dir=args.results.parent) as tmp:
        for n in sorted(args.sizes):
            for src in sources:
                keep = args.keep if args.keep and n == max(args.sizes) and src == ROOT else None
                out = keep or Path(tmp) / f"prep-{int(n)}"
                log = args.results.with_suffix(f".{int(n)}.{'base' if src != ROOT else 'this'}.log")
                rows.append(run_one(src, scaled(args.preset, int(n)), out, log, args.workers))
                print(json.dumps(rows[-1]), flush=True)
                args.results.write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.results.with_suffix(".png"))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
