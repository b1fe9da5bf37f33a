"""Benchmark exact sampling (em, krr) against the float64 inverse-CDF samplers it replaced.

The peers are the previous samplers, verbatim: ``em`` by inverse CDF on float64 probabilities with
one 53-bit uniform, ``krr`` by comparing one 53-bit uniform with the float64 P(top). Both sides
run in the same process on the same inputs (n = 500 scores, CSPRNG as the service uses it), one
selection per call as the service makes it, and as a batch of 1,000 draws per call (evaluation).
Reported: median µs per call over rounds, and exact ÷ float (target ≤ 1.5).

Usage: .venv/bin/python -m scripts.bench.exact_sampling [--rounds 15] [--calls 2000]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np

from recsvc.mechanisms.exact_sampling import em_exact_sample, krr_exact_sample
from recsvc.rng import csprng

N = 500
EPSILONS = (1.0, 10.0, 30.0)


def em_float(q: np.ndarray, d: np.ndarray, eps: float, rng: np.random.Generator, size: int) -> np.ndarray:
    x = (q - q.max()) * (eps / (2.0 * d.max()))
    log_p = x - np.log(np.exp(x).sum())
    cdf = np.cumsum(np.exp(log_p - log_p.max()))
    u = rng.random(size) * cdf[-1]
    return np.minimum(np.searchsorted(cdf, u, side="right"), log_p.shape[0] - 1)


def krr_float(q: np.ndarray, eps: float, rng: np.random.Generator, size: int) -> np.ndarray:
    n = q.shape[0]
    is_top = q == q.max()
    top, others = np.flatnonzero(is_top), np.flatnonzero(~is_top)
    k = top.shape[0]
    e = math.exp(-eps)
    p_top = (1.0 + (k - 1) * e) / (1.0 + (n - 1) * e)
    u = rng.random(size)
    pick_top = u < p_top
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(pick_top, u / p_top, (u - p_top) / (1.0 - p_top))
    return np.where(
        pick_top,
        top[np.minimum((v * k).astype(np.int64), k - 1)],
        others[np.minimum((v * (n - k)).astype(np.int64), n - k - 1)],
    )


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per case (default: 15)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (default: 2000)")
    args = parser.parse_args(argv)
    gen = np.random.default_rng(0)
    q, d = gen.random(N), np.ones(N)
    rng = csprng()
    print(f"n = {N}; median µs per call over {args.rounds} rounds of {args.calls} calls (batch: of 1,000 draws)")
    print(f"{'mechanism':<10}{'ε':>6}{'size':>7}{'float64':>10}{'exact':>10}{'exact/float':>13}")
    for eps in EPSILONS:
        for size, calls in ((1, args.calls), (1000, max(1, args.calls // 20))):
            cases = (
                (
                    "em",
                    lambda s=size, e=eps: em_float(q, d, e, rng, s),
                    lambda s=size, e=eps: em_exact_sample(q, d, e, rng, s),
                ),
                (
                    "krr",
                    lambda s=size, e=eps: krr_float(q, e, rng, s),
                    lambda s=size, e=eps: krr_exact_sample(q, e, rng, s),
                ),
            )
            for name, old, new in cases:
                a, b = per_call_us(old, calls, args.rounds), per_call_us(new, calls, args.rounds)
                print(f"{name:<10}{eps:>6g}{size:>7}{a:>10.1f}{b:>10.1f}{b / a:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
