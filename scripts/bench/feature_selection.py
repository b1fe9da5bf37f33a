"""Benchmark of ``recsvc eval-feature-selection`` (docs/performance.md § Private feature selection).

In one process, on the Fan & Lv data (N = 100, d = 2,000), alternating turns:

1. one DP-SIS selection (``clm`` at k = 8 on the 2,000 scores) against its noise-only floor (the
   one uniform per utility class that clm draws, 1 + k(d − k) of them): the ratio is clm's
   overhead beyond the randomness it cannot avoid;
2. one two-stage trial's support counts (√N = 10 Lasso fits on 10 × 2,000 blocks) against one
   DP-SIS selection: where the study's time goes;
3. with ``--full``: the default study (no output directory), wall and CPU seconds.

    .venv/bin/python -m scripts.bench.feature_selection [--rounds 200] [--full]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from eval.feature_selection import data, methods
from eval.feature_selection.config import FeatureSelectionConfig
from eval.feature_selection.run import run

K = 8


def _timed(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200, help="timed calls of each kind, alternating")
    ap.add_argument("--full", action="store_true", help="also time the default study")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ds = data.fan_lv(rng)
    x, y = data.max_abs(ds.x, ds.y)
    xs, ys = data.standardised(ds.x, ds.y)
    scores = methods.sis_scores(x, y)
    n, d = x.shape
    classes = 1 + K * (d - K)

    def select() -> None:
        methods.private_top_k(scores, float(n), 1.0, 10.0, K, rng)

    def floor() -> None:
        rng.random(classes)

    def trial() -> None:
        methods.support_counts(xs, ys, methods.blocks(n, rng), methods.DEFAULT_LASSO_ALPHA)

    sel: list[float] = []
    flo: list[float] = []
    for _ in range(args.rounds):
        sel += _timed(select, 1)
        flo += _timed(floor, 1)
    tri: list[float] = []
    sel2: list[float] = []
    for _ in range(max(1, args.rounds // 10)):
        tri += _timed(trial, 1)
        sel2 += _timed(select, 1)
    ms = statistics.median
    print(f"Fan & Lv data: N = {n}, d = {d}, k = {K}; {classes:,} utility classes")
    print(
        f"  DP-SIS selection (clm) {1e3 * ms(sel):.3f} ms; noise floor {1e3 * ms(flo):.3f} ms; "
        f"ratio {ms(sel) / ms(flo):.1f}×"
    )
    print(
        f"  two-stage trial ({methods.block_count(n)} Lasso fits) {1e3 * ms(tri):.1f} ms; "
        f"÷ DP-SIS selection {ms(tri) / ms(sel2):.0f}×"
    )
    if args.full:
        w0, c0 = time.perf_counter(), time.process_time()
        run(FeatureSelectionConfig(out=None, progress=False))
        print(f"default study (no output): {time.perf_counter() - w0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")


if __name__ == "__main__":
    main()
