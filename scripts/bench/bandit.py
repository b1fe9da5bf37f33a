"""Benchmark of ``recsvc eval-bandit`` (BENCHMARKS.md § Bandit study).

1. one seed of the paper's setting (T = 50,000, shift after 30,000), every policy and UCB
   reading in this process: seconds per policy and in total (target: all 7 policies < 60 s);
2. with ``--full``: the default run (10 seeds, 2 workers, no output directory), wall time.

    .venv/bin/python -m scripts.bench.bandit [--seed 0] [--full]
"""

from __future__ import annotations

import argparse
import time

from eval.bandit.config import POLICIES, BanditConfig
from eval.bandit.run import run
from eval.bandit.simulate import run_unit, unit_names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="also time the default 10-seed run on 2 workers")
    args = ap.parse_args()
    cfg = BanditConfig(seeds=1)
    print(f"one seed, T = {cfg.horizon:,}, shift after {cfg.shift:,}, 1 process")
    total = policies = 0.0
    for name in unit_names(cfg):
        t0 = time.perf_counter()
        u = run_unit((args.seed, name), cfg)
        dt = time.perf_counter() - t0
        total += dt
        policies += dt if name in POLICIES else 0.0
        print(f"  {name:16s} {dt:6.2f} s   reward t≤shift {u.reward_before:9,.0f}   t>shift {u.reward_after:9,.0f}")
    print(f"  all 7 policies {policies:.1f} s; with the UCB readings {total:.1f} s")
    if args.full:
        t0 = time.perf_counter()
        run(BanditConfig(seeds=10, workers=2, progress=False))
        print(f"default run (10 seeds, 2 workers, no output): {time.perf_counter() - t0:.1f} s wall")


if __name__ == "__main__":
    main()
