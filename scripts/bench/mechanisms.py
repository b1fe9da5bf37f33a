"""Benchmark the selection mechanisms at n = 500 candidates.

1. Per-call latency of ``select`` (CSPRNG, as the service calls it), median of several rounds.
2. Batched throughput of ``select_batch`` (users × trials) as a ratio to the "floor": the time to
   create the same per-user streams and draw the same noise, with no selection logic.
3. GEM's q' normalisation: upper-hull kernel vs the naive O(n²) definition.
4. Catalog scale (Recommend selects over the full catalog): ``select`` and
   ``select_slate(k=10)`` at n = 20,720 (ml20m-shape) vs n = 500, in the same run, for rnm,
   mgem and combined_gem (target: ≤ 40× the n = 500 time), and one two-stage call
   (private top-500 at half of ε, then a 10-item slate) at n = 20,720.
5. ``--peel``: gem and mgem 10-item slates at n = 20,720, the native peel (``select_slate``)
   against the same law drawn step by step (``select`` on the survivors, each step with its m
   exponential draws), alternated in one run, on a user's clipped scores from an artifact
   (``--artifacts``, default artifacts/synthetic-ml20m-shape) or, without one, synthetic scores.

Usage: .venv/bin/python -m scripts.bench.mechanisms [--users 10000] [--trials 50] [--only-scale]
       .venv/bin/python -m scripts.bench.mechanisms --peel [--artifacts DIR]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from recsvc.mechanisms import MECHANISMS, PARAMS, select, select_batch, select_slate, select_two_stage
from recsvc.mechanisms.gem import gem_t, q_prime, q_prime_naive
from recsvc.rng import csprng, user_stream

N = 500
N_CATALOG = 20_720  # ml20m-shape's catalog
SCALE_MECHANISMS = ("rnm", "mgem", "combined_gem")
SLATE_K = 10
GAMMA = PARAMS["gamma"].default  # the floor's draw count depends on it


def _floor_draw(name: str, rng: np.random.Generator, trials: int) -> None:
    """The random draws a mechanism needs for ``trials`` selections, without using them."""
    if name in ("rnm", "rnmh", "gem", "mgem"):
        rng.standard_exponential((trials, N))
    elif name == "rnm_laplace":
        rng.laplace(0.0, 1.0, (trials, N))
    elif name == "pf":
        rng.random((trials, N))  # one merged key-and-coin uniform per candidate
    elif name == "em":  # exact sampling: a 64-bit word per draw
        rng.integers(0, 2**64, trials, dtype=np.uint64)
    elif name == "krr":  # a 64-bit word and the item within its group
        rng.integers(0, 2**64, trials, dtype=np.uint64)
        rng.integers(0, N - 1, trials)
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


def _scale_calls(name: str, g: np.random.Generator) -> list[tuple[str, Callable[[np.ndarray, np.ndarray], object]]]:
    """The calls bench_catalog_scale times for ``name``: (label, call on scores and sensitivities)."""
    return [
        ("select", lambda q, d: select(name, q, d, 1.0, rng=g)),
        (f"select_slate k={SLATE_K}", lambda q, d: select_slate(name, q, d, 1.0, SLATE_K, rng=g)),
    ]


def _best_median(fn: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    times = [_time(fn, calls) for _ in range(rounds)]
    return min(times), statistics.median(times)


def bench_catalog_scale(rounds: int) -> None:
    """select and select_slate(k=10) at n = 500 and n = 20,720, interleaved per mechanism so
    both sizes see the same machine load; the ratio is of the best rounds."""
    rng = np.random.default_rng(0)
    g = csprng()
    data = {n: (rng.normal(size=n), rng.uniform(0.05, 2.0, size=n)) for n in (N, N_CATALOG)}
    print(f"\ncatalog scale: n = {N} vs n = {N_CATALOG}, ε = 1, ChaCha20; best / median of {rounds} rounds (µs)")
    print(
        f"{'mechanism':<13} {'call':<15} {'n=500 best':>11} {'median':>8} {'n=20720 best':>13} {'median':>8} {'ratio':>6}"
    )
    for name in SCALE_MECHANISMS:
        for label, fn in _scale_calls(name, g):
            res = {}
            for n, (q, d) in data.items():
                fn(q, d)  # warm-up (numba JIT)
                repeat = max(2, (4000 if n == N else 100) // (SLATE_K if "slate" in label else 1))
                res[n] = _best_median(functools.partial(fn, q, d), repeat, rounds)
            (b0, m0), (b1, m1) = res[N], res[N_CATALOG]
            print(
                f"{name:<13} {label:<15} {b0 * 1e6:>11.1f} {m0 * 1e6:>8.1f} {b1 * 1e6:>13.1f} {m1 * 1e6:>8.1f} "
                f"{b1 / b0:>5.1f}×",
                flush=True,
            )
    q, d = data[N_CATALOG]
    best, med = _best_median(lambda: select_two_stage("mgem", q, d, 1.0, 500, 0.5, SLATE_K, g), 1, min(rounds, 3))
    print(
        f"two-stage at n = {N_CATALOG}: rnm top-500 (ε/2) then mgem k={SLATE_K} (ε/2): "
        f"best {best * 1e3:.1f} ms, median {med * 1e3:.1f} ms"
    )


def _stepwise_slate(
    name: str, q: np.ndarray, d: np.ndarray, epsilon: float, k: int, g: np.random.Generator
) -> list[int]:
    """The peeled law drawn one ``select`` at a time (each step: m exponentials over q')."""
    alive = np.arange(q.shape[0])
    out = []
    for _ in range(k):
        j = int(select(name, q[alive], d[alive], epsilon / k, rng=g))
        out.append(int(alive[j]))
        alive = np.delete(alive, j)
    return out


def _catalog_user(artifacts: Path) -> tuple[np.ndarray, np.ndarray, str]:
    if not artifacts.is_dir():
        rng = np.random.default_rng(0)
        return rng.uniform(0, 0.003, N_CATALOG), rng.uniform(7e-5, 0.037, N_CATALOG), "synthetic scores"
    from recsvc.artifact import load_artifact
    from recsvc.service.selection import Catalog, Recommender

    art = load_artifact(artifacts)
    cat = Catalog(art)
    ids = art.items["item_id"].to_list()
    hist = [ids[i] for i in np.random.default_rng(0).choice(len(ids), 74, replace=False)]
    q = np.clip(Recommender(art, cat).scores(hist), cat.lo, cat.hi)
    return q, np.asarray(cat.sensitivity, dtype=np.float64), f"{artifacts}: a 74-item history's clipped scores"


def bench_peel(artifacts: Path, rounds: int) -> None:
    q, d, source = _catalog_user(artifacts)
    g = csprng()
    print(
        f"\nnative peel vs step by step, n = {q.shape[0]}, k = {SLATE_K}, {source}; best / median of {rounds} rounds (ms)"
    )
    print(
        f"{'mechanism':<9} {'ε':>6} {'native best':>12} {'median':>8} {'stepwise best':>14} {'median':>8} {'speed-up':>9}"
    )
    for name in ("mgem", "gem"):
        for eps in (0.1, 1.0, 10.0):
            native = functools.partial(select_slate, name, q, d, eps, SLATE_K, g)
            stepwise = functools.partial(_stepwise_slate, name, q, d, eps, SLATE_K, g)
            native(), stepwise()  # warm-up (numba JIT)
            res: dict[str, list[float]] = {"native": [], "stepwise": []}
            for _ in range(rounds):  # alternated, so both see the same load
                res["native"].append(_time(native, 20))
                res["stepwise"].append(_time(stepwise, 5))
            (nb, nm), (sb, sm) = ((min(v), statistics.median(v)) for v in res.values())
            print(
                f"{name:<9} {eps:>6} {nb * 1e3:>12.2f} {nm * 1e3:>8.2f} {sb * 1e3:>14.2f} {sm * 1e3:>8.2f} {sm / nm:>8.1f}×",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=10_000, help="users in the batch benchmark (default 10,000)")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--calls", type=int, default=2000, help="select calls per latency round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only-scale", action="store_true", help="only the catalog-scale comparison (section 4)")
    ap.add_argument("--peel", action="store_true", help="only gem's and mgem's native peel vs step by step (section 5)")
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts/synthetic-ml20m-shape"), help="for --peel")
    args = ap.parse_args()
    if args.peel:
        bench_peel(args.artifacts, args.rounds)
        return
    if args.only_scale:
        bench_catalog_scale(args.rounds)
        return

    rng = np.random.default_rng(0)
    q = rng.normal(size=N)
    d = rng.uniform(0.05, 2.0, size=N)
    scores = rng.normal(size=(args.users, N))
    sens = rng.uniform(0.05, 2.0, size=N)

    print(
        f"n = {N}, ε = 1, γ = {GAMMA}; select with a ChaCha20 CSPRNG; batch {args.users} users × {args.trials} trials"
    )
    print(f"{'mechanism':<13} {'best µs':>8} {'median µs':>10} {'batch s':>9} {'floor s':>9} {'ratio':>6}")
    g = csprng()
    for name in MECHANISMS:
        kw: dict[str, Any] = dict(allow_non_private=True, gamma=GAMMA)
        select(name, q, d, 1.0, rng=g, **kw)  # warm-up (numba JIT)
        # Best and median of the rounds: the best is the cost of the code, the median adds the
        # shared machine's noise (timeit's advice).
        rounds = [
            _time(functools.partial(select, name, q, d, 1.0, rng=g, **kw), args.calls) for _ in range(args.rounds)
        ]
        best, lat = min(rounds), statistics.median(rounds)
        t0 = time.perf_counter()
        select_batch(name, scores, sens, 1.0, args.trials, 1, **kw)
        batch = time.perf_counter() - t0
        t0 = time.perf_counter()
        for b in range(args.users):
            _floor_draw(name, user_stream(1, b), args.trials)
        floor = time.perf_counter() - t0
        print(
            f"{name:<13} {best * 1e6:>8.1f} {lat * 1e6:>10.1f} {batch:>9.3f} {floor:>9.3f} {batch / floor:>6.2f}",
            flush=True,
        )

    t = gem_t(N, 1.0, PARAMS["beta"].default)
    q_prime(q, d, t)
    fast = statistics.median(_time(lambda: q_prime(q, d, t), 500) for _ in range(args.rounds))
    naive = statistics.median(_time(lambda: q_prime_naive(q, d, t), 50) for _ in range(args.rounds))
    print(
        f"GEM q' at n = {N}: hull kernel {fast * 1e6:.1f} µs (O(n) memory), naive O(n²) {naive * 1e6:.1f} µs "
        f"({N * N * 8 // 1024} KiB per user); speed-up {naive / fast:.1f}×"
    )
    bench_catalog_scale(args.rounds)


if __name__ == "__main__":
    main()
