"""Benchmark the selection mechanisms at n = 500 candidates.

1. Per-call latency of ``select`` (CSPRNG, as the service calls it), median of several rounds.
2. Batched throughput of ``select_batch`` (users × trials) as a ratio to the "floor": the time to
   create the same per-user streams and draw the same noise, with no selection logic.
3. GEM's q' normalisation: upper-hull kernel vs the naive O(n²) definition.

Usage: .venv/bin/python scripts/bench_mechanisms.py [--users 10000] [--trials 50]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from recsvc.mechanisms import MECHANISMS, PARAMS, select, select_batch
from recsvc.mechanisms.gem import gem_t, q_prime, q_prime_naive
from recsvc.rng import csprng, user_stream

N = 500
GAMMA = PARAMS["gamma"].default  # the floor's draw count depends on it


def _floor_draw(name: str, rng: np.random.Generator, trials: int) -> None:
    """The random draws a mechanism needs for ``trials`` selections, without using them."""
    if name in ("rnm", "rnmh", "gem", "mgem"):
        rng.standard_exponential((trials, N))
    elif name == "rnm_laplace":
        rng.laplace(0.0, 1.0, (trials, N))
    elif name == "pf":
        rng.random((trials, N))  # one merged key-and-coin uniform per candidate
    elif name in ("em", "krr"):
        rng.random(trials)
    elif name == "random":
        rng.integers(0, N, trials)
    elif name == "combined_gem":
        rng.random(trials)
        rng.standard_exponential((trials, N))
    elif name in ("rs", "rs_improved"):
        k = int((rng.geometric(GAMMA, trials) if name == "rs" else rng.logseries(1 - GAMMA, trials)).sum())
        rng.integers(0, N, k)
        rng.laplace(0.0, 1.0, k)
    else:
        raise ValueError(f"no noise floor for mechanism {name!r}; add the draws it makes to _floor_draw")


def _time(fn: Callable[[], object], repeat: int) -> float:
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=10_000, help="users in the batch benchmark (default 10,000)")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--calls", type=int, default=2000, help="select calls per latency round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    q = rng.normal(size=N)
    d = rng.uniform(0.05, 2.0, size=N)
    scores = rng.normal(size=(args.users, N))
    sens = rng.uniform(0.05, 2.0, size=N)

    print(f"n = {N}, ε = 1, γ = {GAMMA}; select with a ChaCha20 CSPRNG; batch {args.users} users × {args.trials} trials")
    print(f"{'mechanism':<13} {'best µs':>8} {'median µs':>10} {'batch s':>9} {'floor s':>9} {'ratio':>6}")
    g = csprng()
    for name in MECHANISMS:
        kw = dict(allow_non_private=True, gamma=GAMMA)
        select(name, q, d, 1.0, rng=g, **kw)  # warm-up (numba JIT)
        # Best and median of the rounds: the best is the cost of the code, the median adds the
        # shared machine's noise (timeit's advice).
        rounds = [_time(lambda: select(name, q, d, 1.0, rng=g, **kw), args.calls) for _ in range(args.rounds)]
        best, lat = min(rounds), statistics.median(rounds)
        t0 = time.perf_counter()
        select_batch(name, scores, sens, 1.0, args.trials, 1, **kw)
        batch = time.perf_counter() - t0
        t0 = time.perf_counter()
        for b in range(args.users):
            _floor_draw(name, user_stream(1, b), args.trials)
        floor = time.perf_counter() - t0
        print(f"{name:<13} {best * 1e6:>8.1f} {lat * 1e6:>10.1f} {batch:>9.3f} {floor:>9.3f} {batch / floor:>6.2f}", flush=True)

    t = gem_t(N, 1.0, PARAMS["beta"].default)
    q_prime(q, d, t)
    fast = statistics.median(_time(lambda: q_prime(q, d, t), 500) for _ in range(args.rounds))
    naive = statistics.median(_time(lambda: q_prime_naive(q, d, t), 50) for _ in range(args.rounds))
    print(f"GEM q' at n = {N}: hull kernel {fast * 1e6:.1f} µs (O(n) memory), naive O(n²) {naive * 1e6:.1f} µs "
          f"({N * N * 8 // 1024} KiB per user); speed-up {naive / fast:.1f}×")


if __name__ == "__main__":
    main()
