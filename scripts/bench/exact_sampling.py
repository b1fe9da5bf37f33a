"""Benchmark exact sampling (em, krr; with --noisy-max the exact race of rnm, pf, gem, mgem,
combined_gem and rnm_laplace) against the float64 samplers it replaced.

The peers are the previous samplers, verbatim: ``em`` by inverse CDF on float64 probabilities with
one 53-bit uniform, ``krr`` by comparing one 53-bit uniform with the float64 P(top). Both sides
run in the same process on the same inputs (n = 500 scores, CSPRNG as the service uses it), one
selection per call as the service makes it, and as a batch of 1,000 draws per call (evaluation).
Reported: median µs per call over rounds, and exact ÷ float (target ≤ 1.5).

``--noisy-max``: ``select`` per call (validation included, as the service calls it) at n = 500 and
n = 20,720, and ``select_batch`` (users × trials), for the exact race against the float64
sampler it replaced (verbatim below, behind the same checks), alternated round by round.

Usage: .venv/bin/python -m scripts.bench.exact_sampling [--rounds 15] [--calls 2000] [--noisy-max [--only rnm_laplace …]]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from recsvc.mechanisms import gem, select, select_batch
from recsvc.mechanisms.exact_sampling import em_exact_sample, krr_exact_sample
from recsvc.mechanisms.registry import check_params, get_mechanism
from recsvc.mechanisms.validation import check_inputs, check_rng
from recsvc.rng import csprng, user_stream

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


def _u(q: np.ndarray, d: np.ndarray, eps: float) -> np.ndarray:
    return (q - q.max()) * (eps / (2.0 * d.max()))


def _argmax(u: np.ndarray, z: np.ndarray) -> np.ndarray:
    z += u
    return z.argmax(axis=1)


def _gem_float(
    q: np.ndarray, d: np.ndarray, eps: float, sign: float, rng: np.random.Generator, size: int
) -> np.ndarray:
    u = gem._gem_u(q, d, eps, sign * gem.checked_t(q, d, eps, 0.05))
    return _argmax(u, rng.standard_exponential((size, q.shape[0])))


def _combined_float(q: np.ndarray, d: np.ndarray, eps: float, rng: np.random.Generator, size: int) -> np.ndarray:
    eps_c, eps_g = 0.6 * eps, eps - 0.6 * eps
    t = gem.checked_t(q, d, eps_g, 0.05)
    bits = np.where(rng.random(size) < 1.0 / (1.0 + math.exp(-eps_c)), gem.correlation_bit(q, d), 0)
    out = np.empty(size, dtype=np.int64)
    ones = bits == 1
    if ones.any():
        out[ones] = _argmax(gem._gem_u(q, d, eps_g, -t), rng.standard_exponential((int(ones.sum()), q.shape[0])))
    if not ones.all():
        out[~ones] = _argmax(gem._gem_u(q, d, eps_g, t), rng.standard_exponential((int((~ones).sum()), q.shape[0])))
    return out


# The float64 samplers the exact race replaced (2026-12-01), verbatim up to names.
FLOAT_NOISY_MAX: dict[str, Callable[[np.ndarray, np.ndarray, float, np.random.Generator, int], np.ndarray]] = {
    "rnm": lambda q, d, e, g, s: _argmax(_u(q, d, e), g.standard_exponential((s, q.shape[0]))),
    "pf": lambda q, d, e, g, s: _argmax(_u(q, d, e), -np.log1p(-g.random((s, q.shape[0])))),
    "gem": lambda q, d, e, g, s: _gem_float(q, d, e, 1.0, g, s),
    "mgem": lambda q, d, e, g, s: _gem_float(q, d, e, -1.0, g, s),
    "combined_gem": _combined_float,
    # rnm_laplace's float sampler (replaced 2026-12-02), as scripts/bench/exact_slates.py has it
    "rnm_laplace": lambda q, d, e, g, s: _argmax(_u(q, d, e), g.laplace(0.0, 1.0, (s, q.shape[0]))),
}


def float_select(name: str, q: np.ndarray, d: np.ndarray, eps: float, rng: np.random.Generator) -> int:
    """``select`` as it was: the same checks, then the float64 sampler."""
    check_params({}, get_mechanism(name))
    e, qq, dd = check_inputs(eps, q, d)
    return int(FLOAT_NOISY_MAX[name](qq, dd, e, check_rng(rng), 1)[0])


def float_select_batch(name: str, q: np.ndarray, d: np.ndarray, eps: float, trials: int, seed: int) -> np.ndarray:
    out = np.empty((q.shape[0], trials), dtype=np.int64)
    for b in range(q.shape[0]):
        out[b] = FLOAT_NOISY_MAX[name](q[b], d, eps, user_stream(seed, b), trials)
    return out


def bench_noisy_max(rounds: int, calls: int, only: list[str] | None = None) -> None:
    gen = np.random.default_rng(0)
    rng = csprng()
    print(f"median µs per call over {rounds} alternating rounds (CSPRNG); batch: users × trials per call")
    print(f"{'mechanism':<14}{'n':>7}{'case':>12}{'float64':>11}{'exact':>11}{'exact/float':>13}")
    for n in (N, 20_720):
        q, d = gen.normal(size=n), gen.uniform(0.5, 1.0, n)
        users, trials = (100, 20) if n == N else (4, 10)
        qb = q + gen.normal(scale=0.1, size=(users, n))
        for name in only or FLOAT_NOISY_MAX:
            k = calls if n == N else max(1, calls // 40)
            cases = (
                ("select", k, partial(float_select, name, q, d, 1.0, rng), partial(select, name, q, d, 1.0, rng)),
                (
                    f"{users}×{trials}",
                    max(1, k // 200),
                    partial(float_select_batch, name, qb, d, 1.0, trials, 1),
                    partial(select_batch, name, qb, d, 1.0, trials, 1),
                ),
            )
            for case, c, old, new in cases:
                a_t, b_t = [], []
                for _ in range(rounds):  # alternate: the machine's load moves both alike
                    a_t.append(per_call_us(old, c, 1))
                    b_t.append(per_call_us(new, c, 1))
                a, b = statistics.median(a_t), statistics.median(b_t)
                print(f"{name:<14}{n:>7}{case:>12}{a:>11.1f}{b:>11.1f}{b / a:>13.2f}", flush=True)


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
    parser.add_argument(
        "--noisy-max", action="store_true", help="rnm, pf, the gem family and rnm_laplace instead of em and krr"
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(FLOAT_NOISY_MAX), help="with --noisy-max: these mechanisms only"
    )
    args = parser.parse_args(argv)
    if args.noisy_max:
        bench_noisy_max(args.rounds, args.calls, args.only)
        return 0
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
