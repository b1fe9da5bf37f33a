"""Benchmark of the evaluation's candidate readers at paper scale: wall time and peak memory (PSS of
the whole process tree, and of the main process) of ``recsvc eval`` on an artifact's test users,
reading the candidates from ``candidates.parquet`` (an artifact without ``candidates/``) against
the memory-mapped arrays of ``candidates/``, in one session.

    .venv/bin/python -m scripts.bench.eval_memmap --artifacts artifacts/synthetic-netflix-shape
        [--baseline-src DIR] [--users 4000] [--workers 2] [--work /tmp/bench-eval-memmap]

The source artifact is only read. When it has no ``candidates/``, a copy with them is written to
``--work`` (unchanged files hard-linked, never written). Runs, each a fresh ``recsvc eval``:
``baseline`` (the code in DIR, e.g. ``git archive`` of an older commit, on the source artifact,
when given), ``table`` (this code, the artifact without arrays) and ``mapped`` (this code, the
arrays). Every run's result tables must be byte-identical; the script fails otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from eval.testing import without_candidate_arrays
from recsvc.artifact import CANDIDATES, ArtifactWriter, load_artifact
from scripts.bench.pipeline import ROOT, run_measured


def with_candidate_arrays(src: Path, out: Path) -> Path:
    """``src`` itself if it has ``candidates/``, else a copy at ``out`` that has them: the other
    files hard-linked, ``candidates.parquet`` and the arrays written anew by the ArtifactWriter."""
    art = load_artifact(src)
    if art.has_candidate_arrays:
        return src
    content = {k: v for k, v in art.manifest.to_dict().items() if k not in ("files", "format_version")}
    t0 = time.perf_counter()
    with ArtifactWriter(out, force=True, protect={"artifacts": src}) as w:
        # candidates.parquet is written, not linked: a write to a link would reach the source.
        w.keep(art.path, [f for f in art.manifest.files if f != CANDIDATES])
        w.write_candidates(art.candidates)
        w.commit(content)
    print(f"[bench] wrote {out} with candidates/ in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def table_digests(results: Path) -> dict[str, str]:
    """sha256 of every result table (report.md and summary.json carry the run's seconds)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(results.iterdir())
        if p.suffix in (".parquet", ".csv")
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--baseline-src", type=Path, default=None)
    ap.add_argument("--users", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-eval-memmap"))
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "bench_eval_memmap.json")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    src = args.artifacts.resolve()
    mapped = with_candidate_arrays(src, args.work / "with-arrays")
    table = src
    if load_artifact(src).has_candidate_arrays:
        shutil.rmtree(args.work / "without-arrays", ignore_errors=True)
        table = without_candidate_arrays(src, args.work / "without-arrays")
    runs: list[tuple[str, Path, Path]] = [("table", ROOT, table), ("mapped", ROOT, mapped)]
    if args.baseline_src is not None:
        runs.insert(0, ("baseline", args.baseline_src.resolve(), table))
    rows: list[dict[str, Any]] = []
    for name, code, artifact in runs:
        out = args.work / f"results-{name}"
        cmd = [sys.executable, "-m", "recsvc.app.cli", "eval", "--artifacts", str(artifact)]
        cmd += ["--users", str(args.users), "--workers", str(args.workers), "--out", str(out), "--force"]
        before = os.getloadavg()[0]
        measured = run_measured(cmd, args.work / f"{name}.log", cwd=code)  # cwd first on sys.path: its code
        rows.append({"run": name, **measured, "load": [round(before, 1), round(os.getloadavg()[0], 1)]})
        rows[-1]["tables"] = table_digests(out)
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "tables"}), flush=True)
    args.results.write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| run | wall s | peak PSS GiB (tree) | peak PSS GiB (main) | peak RSS sum GiB | load (1 min) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['wall_s']} | {r['peak_pss_gib']} | {r['peak_pss_main_gib']} | "
            f"{r['peak_rss_sum_gib']} | {r['load'][0]}–{r['load'][1]} |"
        )
    same = all(r["tables"] == rows[0]["tables"] for r in rows)
    print(f"\nresult tables byte-identical across runs: {same} ({len(rows[0]['tables'])} files)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
